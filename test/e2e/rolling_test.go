package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

// TestRollingUpdateTwoDaemons: the test plays the kubelet, so it can do
// what a real kubelet and scheduler never do: interleave prepares across
// the two daemons and ask for an HCA already prepared for another claim.
// The DaemonSet's real rolling update on a real node is in
// realscenarios_test.go (rolling-update).
//
// The chart's default update runs the new
// daemon beside the old one (--pod-uid, maxSurge 1) and the kubelet may
// call either, in any order. Claims prepared through each end up in the
// one checkpoint; after the old daemon stops, the new one refuses a second
// claim for the HCA the old one prepared, and unprepares that claim.
func TestRollingUpdateTwoDaemons(t *testing.T) {
	t.Parallel() // no node: see parallel in main_test.go
	w := newBareWorld(t, "-v=2")
	ctx := context.Background()
	if _, err := w.cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const oldUID, newUID = "0a0a0a0a-0000-4000-8000-000000000001", "0b0b0b0b-0000-4000-8000-000000000002"
	registry := filepath.Join(w.kubeletDir, "plugins_registry")
	start := func(uid string) (*cluster.DriverProcess, drapb.DRAPluginClient) {
		t.Helper()
		p, err := cluster.StartDriver(w.binary, append(slices.Clone(w.args), "--pod-uid="+uid)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("daemon %s logs:\n%s", uid, p.Logs())
			}
			p.Kill()
		})
		return p, w.registerAt(filepath.Join(registry, kubeletplugin.RollingUpdateRegistrarSocketFile(registry, "rdma.dra.dev", types.UID(uid))))
	}
	oldProc, oldDRA := start(oldUID)
	_, newDRA := start(newUID)

	prepare := func(dra drapb.DRAPluginClient, name, device string) (*drapb.Claim, string) {
		t.Helper()
		c := allocatedClaim(t, w.cp.Client, name, device)
		ref := &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
		resp, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
		if err != nil {
			t.Fatal(err)
		}
		return ref, resp.Claims[ref.Uid].Error
	}
	// Interleaved, so each daemon has read the checkpoint before the other
	// writes it.
	y, errY := prepare(newDRA, "y", "mlx5-2")
	x, errX := prepare(oldDRA, "x", "mlx5-1")
	v, errV := prepare(newDRA, "v", "mlx5-3")
	if errX != "" || errY != "" || errV != "" {
		t.Fatalf("prepares: y %q, x %q, v %q", errY, errX, errV)
	}
	cp, err := checkpoint.NewStore(filepath.Join(w.kubeletDir, "plugins", "rdma.dra.dev", "checkpoint.json")).Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*drapb.Claim{x, y, v} {
		if _, ok := cp.Claims[c.Uid]; !ok {
			t.Errorf("checkpoint lost claim %s (it holds %d)", c.Name, len(cp.Claims))
		}
	}

	if err := oldProc.Stop(); err != nil {
		t.Errorf("old daemon: SIGTERM exit %v", err)
	}
	if _, e := prepare(newDRA, "x2", "mlx5-1"); !strings.Contains(e, "mlx5-1") {
		t.Errorf("a second claim for x's mlx5-1 through the new daemon: error %q, want a refusal naming mlx5-1", e)
	}
	uresp, err := newDRA.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{x}})
	if err != nil || uresp.Claims[x.Uid].Error != "" {
		t.Fatalf("the new daemon unpreparing the old one's claim: %v %+v", err, uresp)
	}
	want := []string{y.Uid, v.Uid}
	slices.Sort(want)
	if uids, _ := cdi.NewSpecDir(w.cdiDir).ClaimUIDs(); !slices.Equal(uids, want) {
		t.Errorf("CDI specs after unpreparing x: %v, want y's and v's %v", uids, want)
	}
	if _, e := prepare(newDRA, "z", "mlx5-1"); e != "" {
		t.Errorf("mlx5-1 after x was unprepared: %s", e)
	}
	if _, e := prepare(newDRA, "y2", "mlx5-2"); !strings.Contains(e, "mlx5-2") {
		t.Errorf("a second claim for y's mlx5-2: error %q, want a refusal naming mlx5-2", e)
	}
}
