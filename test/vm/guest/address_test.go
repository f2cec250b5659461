package guest

// Address events on the real kernel: an IPv4 address added to eth1 becomes
// a RoCE GID of rxe1, and the driver's inventory follows through the
// rtnetlink address message alone. Its periodic rescan is an hour away and
// port polling sees no state change, so nothing else could bring it.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

func TestAddressEventsUpdateGIDs(t *testing.T) {
	inGuest(t)
	n := startNode(t, nodeConfig{rescan: time.Hour})
	addr := netip.MustParsePrefix("10.0.3.77/24")
	gid := ipv4GID(addr.Addr())
	hasGID := func() bool {
		for _, h := range n.drv.Inventory().HCAs {
			if h.Name == "rxe1" && len(h.Ports) > 0 {
				return slices.ContainsFunc(h.Ports[0].GIDs, func(g hca.GID) bool { return g.GID == gid })
			}
		}
		return false
	}
	if hasGID() {
		t.Fatalf("rxe1 already has GID %s", gid)
	}
	// Five rounds: the kernel fills the GID table from a work queue after
	// it sends the message, so a rescan that came too soon would show here.
	type step struct {
		cmd  string
		want bool
	}
	var steps []step
	for range 5 {
		steps = append(steps, step{"add", true}, step{"del", false})
	}
	for _, step := range steps {
		start := time.Now()
		command(t, "ip", "addr", step.cmd, addr.String(), "dev", "eth1")
		err := poll.Until(t.Context(), fmt.Sprintf("rxe1's GID %s present=%v in the inventory", gid, step.want), 20*time.Millisecond, 30*time.Second,
			func(context.Context) (bool, string, error) { return hasGID() == step.want, "", nil })
		if err != nil {
			t.Fatalf("ip addr %s %s: %v (rescan is an hour away: the address event did not rescan)", step.cmd, addr, err)
		}
		t.Logf("ip addr %s %s: GID %s present=%v in the driver's inventory after %v", step.cmd, addr, gid, step.want,
			time.Since(start).Round(time.Millisecond))
	}
}

// ipv4GID is the kernel's IPv4-mapped GID of an address, as sysfs prints it.
func ipv4GID(a netip.Addr) string {
	b := a.As4()
	return fmt.Sprintf("0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", b[0], b[1], b[2], b[3])
}
