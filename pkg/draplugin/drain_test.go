package draplugin_test

import (
	"context"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
)

// TestDrainLeavesLaterCallsUndone: the call in flight when Drain begins
// finishes, Drain waits for it, and calls after it change nothing on the
// node; they end with their cancellation (grpc's Stop), so the kubelet
// asks the next daemon, which does the work once.
func TestDrainLeavesLaterCallsUndone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	a := e.claim("a", hostNetworkPod("pa", true), one("mlx5-0"))
	e.mustPrepare(a)

	e.drv.Drain(0)

	b := e.claim("b", hostNetworkPod("pb", true), one("mlx5-1"))
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if res, err := e.drv.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{b}); err == nil {
		t.Errorf("prepare after Drain: %v, want the call's cancellation", res)
	}
	ctx2, cancel2 := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel2()
	if res, err := e.drv.UnprepareResourceClaims(ctx2, []kubeletplugin.NamespacedObject{{UID: a.UID}}); err == nil {
		t.Errorf("unprepare after Drain: %v, want the call's cancellation", res)
	}

	uids, err := cdi.NewSpecDir(e.cdiDir).ClaimUIDs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(uids, []string{string(a.UID)}) {
		t.Errorf("CDI specs after Drain for claims %v, want just %s's, untouched", uids, a.UID)
	}
	cp, err := checkpoint.NewStore(e.checkpointPath()).Load()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cp.Claims[string(a.UID)]; !ok || len(cp.Claims) != 1 {
		t.Errorf("checkpoint after Drain holds %d claims (a: %v), want just a", len(cp.Claims), ok)
	}
}
