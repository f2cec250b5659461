package draplugin_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// events is an ordered log of what happened, written from several
// goroutines: the tests assert order, never durations.
type events struct {
	mu  sync.Mutex
	log []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = append(e.log, s)
}

func (e *events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.log, " < ")
}

// before reports whether a was logged and b was not logged before it.
func (e *events) before(a, b string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.log {
		switch s {
		case a:
			return true
		case b:
			return false
		}
	}
	return false
}

// heldView is the host's namespace with the first device listing held
// until release is closed: the kernel slow to hand a moved HCA back.
type heldView struct {
	*hostView
	ev      *events
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *heldView) Devices() ([]rdmanl.Device, error) {
	first := false
	h.once.Do(func() { first = true })
	if first {
		h.ev.add("check started")
		close(h.entered)
		<-h.release
		h.ev.add("check released")
	}
	return h.hostView.Devices()
}

// guard bounds a wait that only a regression makes long, so the test fails
// with the events so far instead of hanging.
const guard = 2 * time.Minute

func wait(t *testing.T, ch <-chan struct{}, what string, ev *events) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(guard):
		t.Fatalf("%s never happened; events: %s", what, ev)
	}
}

// An unprepare whose moved HCA has not come back does not hold up the
// next prepare: its check runs after the call returns, and a prepare
// starts, runs and returns while the check is still waiting for the
// kernel. Before, the check ran inside the call the helper serializes.
func TestUnprepareCheckDoesNotDelayPrepare(t *testing.T) {
	t.Parallel()
	e := exclusiveEnv(t, false)
	ev := &events{}
	view := &heldView{hostView: &hostView{node: e.node, held: map[string]bool{}}, ev: ev,
		entered: make(chan struct{}), release: make(chan struct{})}
	e.deps.hostRDMA, e.deps.metrics = view, draplugin.NewMetrics()
	e.start()
	moved := e.claim("moved", hostNetworkPod("p", false), one("mlx5-3"))
	e.mustPrepare(moved)
	view.hold("mlx5_3", true) // in the pod's namespace, still

	unprepared := make(chan struct{})
	go func() {
		defer close(unprepared)
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		resp, err := e.dra.NodeUnprepareResources(ctx, reqUnprepare(ref(moved)))
		ev.add(fmt.Sprintf("unprepare returned (err %v)", err))
		if err == nil && resp.Claims["uid-moved"].Error != "" {
			t.Errorf("unprepare: %s", resp.Claims["uid-moved"].Error)
		}
	}()
	wait(t, view.entered, "the check that mlx5_3 came back", ev)

	next := e.claim("next", hostNetworkPod("q", true), one("mlx5-4"))
	ev.add("prepare started")
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	resp, err := e.dra.NodePrepareResources(ctx, reqPrepare(ref(next)))
	ev.add("prepare returned")
	if err != nil || resp.Claims["uid-next"].Error != "" {
		t.Fatalf("prepare while the check waits: %v %v; events: %s", err, resp, ev)
	}
	wait(t, unprepared, "the unprepare's return", ev)
	if !ev.before("prepare returned", "check released") {
		t.Errorf("the prepare did not complete while the check waited; events: %s", ev)
	}
	close(view.release) // the kernel still holds it: a warning
	e.drv.WaitReturnChecks()
	if v := metricValue(t, e.deps.metrics, "rdma_dra_netns_not_returned_total", "hca", "mlx5_3"); v != 1 {
		t.Errorf("netns_not_returned_total{hca=mlx5_3} = %v, want 1 (the check still warns); events: %s", v, ev)
	}
	t.Logf("events: %s", ev)
}

// heldPods holds every pod lookup until release is closed: an informer
// cache miss that goes to a slow API server.
type heldPods struct {
	inner   draplugin.PodGetter
	ev      *events
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *heldPods) GetPod(ctx context.Context, ns, name string, uid types.UID) (*corev1.Pod, error) {
	h.once.Do(func() {
		h.ev.add("lookup started")
		close(h.entered)
	})
	<-h.release
	return h.inner.GetPod(ctx, ns, name, uid)
}

// A prepare waiting for a pod lookup does not hold the lock rescans take:
// a rescan starts and ends while the lookup waits.
func TestPodLookupDoesNotBlockRescan(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ev := &events{}
	pods := &heldPods{ev: ev, entered: make(chan struct{}), release: make(chan struct{})}
	e.deps.pods = func(inner draplugin.PodGetter) draplugin.PodGetter { pods.inner = inner; return pods }
	e.start()
	c := e.claim("c", hostNetworkPod("p", true), one("mlx5-2"))

	prepared := make(chan struct{})
	go func() {
		defer close(prepared)
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		resp, err := e.dra.NodePrepareResources(ctx, reqPrepare(ref(c)))
		ev.add("prepare returned")
		if err != nil || resp.Claims["uid-c"].Error != "" {
			t.Errorf("prepare: %v %v", err, resp)
		}
	}()
	wait(t, pods.entered, "the pod lookup", ev)
	rescanned := make(chan struct{})
	go func() {
		defer close(rescanned)
		if err := e.drv.Rescan(context.Background()); err != nil {
			t.Error(err)
		}
		ev.add("rescan returned")
	}()
	wait(t, rescanned, "the rescan's return", ev)
	close(pods.release)
	wait(t, prepared, "the prepare's return", ev)
	if !ev.before("rescan returned", "prepare returned") {
		t.Errorf("the rescan waited for the prepare's pod lookup; events: %s", ev)
	}
}

// heldSpecs is the CDI spec directory with the first spec write of one
// claim held until release is closed: a slow disk under that claim.
type heldSpecs struct {
	draplugin.CDISpecs
	uid     string
	ev      *events
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *heldSpecs) WriteClaim(uid string, common cdispec.ContainerEdits, devices []cdi.ClaimDevice) error {
	if uid == h.uid {
		h.once.Do(func() {
			h.ev.add("slow write started")
			close(h.entered)
			<-h.release
			h.ev.add("slow write released")
		})
	}
	return h.CDISpecs.WriteClaim(uid, common, devices)
}

// A prepare does not wait for another claim's disk: while one claim's spec
// write is held, a second claim on another HCA is prepared, its container
// gets its own HCA, and the first completes once released. Before, one
// mutex held across every write (and the helper's serialization) queued
// the second behind the first.
func TestPrepareDoesNotWaitForAnotherClaimsIO(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ev := &events{}
	held := &heldSpecs{uid: "uid-slow", ev: ev, entered: make(chan struct{}), release: make(chan struct{})}
	e.deps.specs = func(inner draplugin.CDISpecs) draplugin.CDISpecs { held.CDISpecs = inner; return held }
	e.start()
	release := sync.OnceFunc(func() { close(held.release) })
	t.Cleanup(release) // a failure does not leave the call hanging
	slow := e.claim("slow", hostNetworkPod("p1", true), one("mlx5-0"))
	fast := e.claim("fast", hostNetworkPod("p2", true), one("mlx5-1"))

	slowDone := make(chan struct{})
	var slowResp *drapb.NodePrepareResourcesResponse
	var slowErr error
	go func() {
		defer close(slowDone)
		slowResp, slowErr = e.dra.NodePrepareResources(context.Background(), reqPrepare(ref(slow)))
		ev.add("slow prepared")
	}()
	wait(t, held.entered, "the slow claim's spec write", ev)

	fastDone := make(chan struct{})
	var fastResp *drapb.NodePrepareResourcesResponse
	var fastErr error
	go func() {
		defer close(fastDone)
		fastResp, fastErr = e.dra.NodePrepareResources(context.Background(), reqPrepare(ref(fast)))
		ev.add("fast prepared")
	}()
	wait(t, fastDone, "the second claim's prepare while the first claim's write is held", ev)
	select {
	case <-slowDone:
		t.Fatalf("the slow claim was prepared while its spec write was held; events: %s", ev)
	default:
	}
	if fastErr != nil || fastResp.Claims[string(fast.UID)].Error != "" {
		t.Fatalf("the fast claim: %v %v", fastErr, fastResp)
	}
	checkContainer(t, "the fast claim", e.container(fastResp.Claims[string(fast.UID)].Devices[0].CdiDeviceIds...), "mlx5_1", "uverbs1 c 231:193")

	release()
	wait(t, slowDone, "the slow claim's prepare after the release", ev)
	if !ev.before("fast prepared", "slow write released") {
		t.Errorf("the second claim was not prepared before the first claim's write was released; events: %s", ev)
	}
	if slowErr != nil || slowResp.Claims[string(slow.UID)].Error != "" {
		t.Fatalf("the slow claim: %v %v", slowErr, slowResp)
	}
	checkContainer(t, "the slow claim", e.container(slowResp.Claims[string(slow.UID)].Devices[0].CdiDeviceIds...), "mlx5_0", "uverbs0 c 231:192")
	cp, err := checkpoint.NewStore(e.checkpointPath()).Load()
	if err != nil {
		t.Fatal(err)
	}
	if got := sortedUIDs(cp); !slices.Equal(got, []string{"uid-fast", "uid-slow"}) {
		t.Errorf("checkpoint claims = %v, want both", got)
	}
}

// Two daemons of a rolling update share the checkpoint and are not
// serialized: when both prepare a claim for one HCA at once (each sees the
// HCA free in its memory), the check under the checkpoint's file lock lets
// the first to record it keep it; the other is refused and undone, its
// spec removed. One HCA is never recorded for two claims.
func TestTwoDaemonsCannotRecordOneHCATwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ev := &events{}
	held := &heldSpecs{uid: "uid-x", ev: ev, entered: make(chan struct{}), release: make(chan struct{})}
	e.deps.specs = func(inner draplugin.CDISpecs) draplugin.CDISpecs { held.CDISpecs = inner; return held }
	e.start()
	release := sync.OnceFunc(func() { close(held.release) })
	t.Cleanup(release)
	x := e.claim("x", hostNetworkPod("p1", true), one("mlx5-0"))
	y := e.claim("y", hostNetworkPod("p2", true), one("mlx5-0"))

	xDone := make(chan struct{})
	var xResp *drapb.NodePrepareResourcesResponse
	var xErr error
	go func() {
		defer close(xDone)
		xResp, xErr = e.dra.NodePrepareResources(context.Background(), reqPrepare(ref(x)))
	}()
	wait(t, held.entered, "the first daemon's spec write of claim x", ev)

	e.deps.specs = nil
	second, err := e.newDriver(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	results, err := second.PrepareResourceClaims(t.Context(), []*resourceapi.ResourceClaim{y})
	if err != nil || results[y.UID].Err != nil {
		t.Fatalf("the second daemon's prepare of y: %v %v", err, results[y.UID].Err)
	}
	release()
	wait(t, xDone, "the first daemon's prepare of x after the release", ev)
	if xErr != nil {
		t.Fatal(xErr)
	}
	if got, want := xResp.Claims[string(x.UID)].Error, "device mlx5-0 (mlx5_0) is already prepared for claim default/y"; !strings.Contains(got, want) {
		t.Errorf("claim x: error %q, want one containing %q", got, want)
	}
	cp, err := checkpoint.NewStore(e.checkpointPath()).Load()
	if err != nil {
		t.Fatal(err)
	}
	if got := sortedUIDs(cp); !slices.Equal(got, []string{"uid-y"}) {
		t.Errorf("checkpoint claims = %v, want only uid-y", got)
	}
	specs := cdi.NewSpecDir(e.cdiDir)
	if uids, err := specs.ClaimUIDs(); err != nil || !slices.Equal(uids, []string{"uid-y"}) {
		t.Errorf("CDI specs of claims %v (%v), want only uid-y's: the refused claim's must be undone", uids, err)
	}
}

// checkContainer checks that a container sees exactly the HCA ibdev, by
// its uverbs node (name and number).
func checkContainer(t *testing.T, what string, s *oci.Spec, ibdev, uverbs string) {
	t.Helper()
	node := "/dev/infiniband/" + strings.Fields(uverbs)[0]
	wantDevs := []string{"/dev/infiniband/rdma_cm c 10:58", "/dev/infiniband/" + uverbs}
	if got := devicesOf(s); !slices.Equal(got, wantDevs) {
		t.Errorf("%s: container devices = %v, want %v", what, got, wantDevs)
	}
	wantEnv := map[string]string{"RDMA_DEVICES": ibdev, "RDMA_DEVICE_" + strings.ToUpper(ibdev): node}
	if got := envOf(s, "RDMA_DEVICE"); !maps.Equal(got, wantEnv) {
		t.Errorf("%s: container env = %v, want %v", what, got, wantEnv)
	}
}

func sortedUIDs(cp checkpoint.Checkpoint) []string {
	return slices.Sorted(maps.Keys(cp.Claims))
}

func reqPrepare(claims ...*drapb.Claim) *drapb.NodePrepareResourcesRequest {
	return &drapb.NodePrepareResourcesRequest{Claims: claims}
}

func reqUnprepare(claims ...*drapb.Claim) *drapb.NodeUnprepareResourcesRequest {
	return &drapb.NodeUnprepareResourcesRequest{Claims: claims}
}
