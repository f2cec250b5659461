package draplugin_test

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
)

// TestReboot: the node reboots (the CDI dir emptied, a new boot ID) with
// claims in the checkpoint. The daemon discards the claims of the previous
// boot, keeps the others, and the kubelet's calls after a reboot work: a
// fresh prepare of a claim whose pod is still bound, an unprepare of one
// whose pod went away.
func TestReboot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	live := e.claim("live", hostNetworkPod("p1", true), one("mlx5-6"))
	gone := e.claim("gone", hostNetworkPod("p2", true), one("mlx5-5"))
	afterBoot := e.claim("after-boot", hostNetworkPod("p3", true), one("mlx5-4"))
	unknownBoot := e.claim("unknown-boot", hostNetworkPod("p4", true), one("mlx5-3"))
	liveIDs := e.mustPrepare(live)
	e.mustPrepare(gone)
	afterIDs := e.mustPrepare(afterBoot)
	unknownIDs := e.mustPrepare(unknownBoot)
	e.stop()

	// Two claims the reboot does not concern: one prepared in the new boot
	// (by a daemon that then stopped), one from a release that kept no
	// boot ID.
	err := checkpoint.NewStore(e.checkpointPath()).Update(func(cp *checkpoint.Checkpoint) error {
		c := cp.Claims[string(afterBoot.UID)]
		c.BootID = bootB
		cp.Claims[c.UID] = c
		c = cp.Claims[string(unknownBoot.UID)]
		c.BootID = ""
		cp.Claims[c.UID] = c
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The reboot: tmpfs emptied, a new boot ID; p2 was deleted meanwhile.
	entries, _ := os.ReadDir(e.cdiDir)
	for _, en := range entries {
		if err := os.Remove(filepath.Join(e.cdiDir, en.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.client.ResourceV1().ResourceClaims("default").Delete(context.Background(), gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.bootID, e.deps.metrics = bootB, draplugin.NewMetrics()
	e.start()

	cp, err := checkpoint.NewStore(e.checkpointPath()).Load()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := slices.Sorted(maps.Keys(cp.Claims)), []string{string(afterBoot.UID), string(unknownBoot.UID)}; !slices.Equal(got, want) {
		t.Errorf("checkpoint after the reboot holds %v, want only %v (the previous boot's claims discarded)", got, want)
	}
	if v := counterValue(t, e.deps.metrics, "rdma_dra_reboot_discarded_claims_total"); v != 2 {
		t.Errorf("reboot_discarded_claims_total = %v, want 2", v)
	}
	// The kept claims' specs are rewritten (containers may restart with
	// them); the discarded ones have none until prepared again.
	for _, ids := range [][]string{afterIDs, unknownIDs} {
		if len(devicesOf(e.container(ids...))) == 0 {
			t.Errorf("the spec of a kept claim (%v) was not rewritten", ids)
		}
	}
	if uids := specUIDs(t, e); slices.Contains(uids, string(live.UID)) || slices.Contains(uids, string(gone.UID)) {
		t.Errorf("specs of discarded claims exist before any prepare: %v", uids)
	}

	// The kubelet creates p1's new sandbox: a fresh prepare.
	if got := e.mustPrepare(live); !slices.Equal(got, liveIDs) {
		t.Errorf("prepare after the reboot = %v, want %v", got, liveIDs)
	}
	if got := devicesOf(e.container(liveIDs...)); !slices.Contains(got, "/dev/infiniband/uverbs6 c 231:198") {
		t.Errorf("after the re-prepare the container gets %v, want uverbs6", got)
	}
	// Its reconcile loop unprepares p2's claim: an unknown claim, success.
	if r := e.unprepare(ref(gone))[string(gone.UID)]; r.Error != "" {
		t.Errorf("unprepare of a discarded claim: %s", r.Error)
	}
	cp, err = checkpoint.NewStore(e.checkpointPath()).Load()
	if err != nil {
		t.Fatal(err)
	}
	if got := cp.Claims[string(live.UID)].BootID; got != bootB {
		t.Errorf("the re-prepared claim's boot ID = %q, want the new boot %q", got, bootB)
	}

	// A restart in the same boot discards nothing and keeps every spec.
	e.stop()
	e.deps.metrics = draplugin.NewMetrics()
	e.start()
	if v := counterValue(t, e.deps.metrics, "rdma_dra_reboot_discarded_claims_total"); v != 0 {
		t.Errorf("after a restart without a reboot, reboot_discarded_claims_total = %v, want 0", v)
	}
	if uids := specUIDs(t, e); !slices.Contains(uids, string(live.UID)) {
		t.Errorf("a restart in the same boot lost the spec of %s: %v", live.Name, uids)
	}
}

func specUIDs(t *testing.T, e *env) []string {
	t.Helper()
	uids, err := cdi.NewSpecDir(e.cdiDir).ClaimUIDs()
	if err != nil {
		t.Fatal(err)
	}
	return uids
}

func counterValue(t *testing.T, m *draplugin.Metrics, name string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
