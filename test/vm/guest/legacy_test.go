package guest

// The legacy route on the real kernel: a claim on the legacy device (what
// an `rdma/hca: 1` pod gets through extendedResourceName) gives its
// container every HCA of the node, and each one opens.

import (
	"slices"
	"strings"
	"testing"
	"time"

	rslices "github.com/rdma-dra/rdma-dra-driver/pkg/slices"
)

func TestLegacyContainerGetsEveryHCA(t *testing.T) {
	inGuest(t)
	skipWithoutRunc(t)
	n := startNode(t, nodeConfig{shares: 1000, legacyShares: 1000})
	c := n.claim("legacy", []string{rslices.LegacyDeviceName}, "22222222-aaaa-4aaa-8aaa-000000000001")
	ids := n.prepare(c)
	t.Logf("CDI devices: %v", ids)
	inv := n.drv.Inventory()
	want := []string{"rdma_cm"}
	for _, dev := range rdmaDevices() {
		want = append(want, uverbsOf(t, inv, dev))
	}
	slices.Sort(want)
	if got := devices(t, "legacy-ls", n.cdiDir, ids...); !slices.Equal(got, want) {
		t.Errorf("legacy container: /dev/infiniband = %v, want %v", got, want)
	}
	// Every HCA opens and answers a query from inside the container.
	script := ""
	for _, dev := range rdmaDevices() {
		script += "ibv_devinfo -d " + dev + " | grep -E 'hca_id|state' || exit 1; "
	}
	r := runContainer(t, "legacy-open", withCDI(t, containerSpec("legacy-open", "sh", "-c", script), n.cdiDir, ids...), 30*time.Second)
	if r.exit != 0 {
		t.Errorf("opening every HCA in the legacy container: exit %d\n%s", r.exit, r.out)
	}
	for _, dev := range rdmaDevices() {
		if !strings.Contains(r.out, "hca_id:\t"+dev) {
			t.Errorf("legacy container did not query %s:\n%s", dev, r.out)
		}
	}
	t.Logf("legacy container:\n%s", r.out)
	n.unprepare(c)
}
