package guest

// Limits that bound the pod (issue 29) on the real kernel: the kernel
// charges a verbs object to the rdma cgroup of the process that creates
// it, and checks the limit of every ancestor. A container's own rdma.max
// therefore does not bound a sidecar without a claim that is handed the
// container's uverbs file over a unix socket (what ibv_import_device
// does); the pod's cgroup, which the hook limits to the sum of the pod's
// claims, does.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
	"github.com/rdma-dra/rdma-dra-driver/test/vm/uverbs"
)

// podCgroup is where the kubelet (cgroupfs driver) puts a BestEffort pod's
// cgroup, under the guest tests' own /vmtest.
func podCgroup(podUID string) string { return "/vmtest/kubepods/besteffort/pod" + podUID }

// inPod puts the container's cgroup in its pod's, as the kubelet lays
// them out.
func inPod(spec *specs.Spec, podUID string) *specs.Spec {
	spec.Linux.CgroupsPath = podCgroup(podUID) + "/" + spec.Hostname
	return spec
}

// withHelper runs the guest test binary's helper in the container.
func withHelper(spec *specs.Spec, helper string, env ...string) *specs.Spec {
	spec.Process.Args = []string{"/guest/guest.test"}
	spec.Process.Env = append(spec.Process.Env, append([]string{helperEnv + "=" + helper}, env...)...)
	return withGuestBinary(spec)
}

// claimForPod is a claim consuming capacities on rxe0, reserved for the
// pod podUID.
func (n *node) claimForPod(name, podUID string, consumed map[string]int64, share string) *resourceapi.ResourceClaim {
	n.t.Helper()
	c := n.claimConsuming(name, consumed, []string{"rxe0"}, share)
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "sidecar-pod", UID: types.UID(podUID)}}
	c, err := n.client.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	return c
}

// podOwnerHelper, container A (RDMA_DRA_VM_HELPER=pod-owner): a verbs
// context on $UVERBS (an rxe's), $N protection domains of its own, then the uverbs
// file handed to whoever connects to $SOCK; it holds everything until the
// test opens the FIFO $RELEASE.
func podOwnerHelper() int {
	fd, err := uverbs.OpenContext(os.Getenv("UVERBS"))
	if err != nil {
		fmt.Println("owner context:", err)
		return 1
	}
	fmt.Println("owner context: ok")
	n, _ := strconv.Atoi(os.Getenv("N"))
	uverbs.PDs(os.Stdout, "owner", fd, n, uverbs.DriverRXE)
	if err := uverbs.SendFD(os.Getenv("SOCK"), fd); err != nil {
		fmt.Println("owner handing the uverbs file over:", err)
		return 1
	}
	fmt.Println("owner: the sidecar is done with the uverbs file")
	if err := uverbs.WaitFIFO(os.Getenv("RELEASE")); err != nil {
		fmt.Println("owner waiting for the release:", err)
		return 1
	}
	return 0
}

// podSidecarHelper, container B (RDMA_DRA_VM_HELPER=pod-sidecar): no
// device of its own; it receives the owner's uverbs file on $SOCK and asks
// for $N protection domains on it, charged to its own cgroup.
func podSidecarHelper() int {
	fd, conn, err := uverbs.RecvFD(os.Getenv("SOCK"))
	if err != nil {
		fmt.Println("sidecar receiving the uverbs file:", err)
		return 1
	}
	defer conn.Close()
	fmt.Println("sidecar: got the owner's uverbs file")
	n, _ := strconv.Atoi(os.Getenv("N"))
	uverbs.PDs(os.Stdout, "sidecar", fd, n, uverbs.DriverRXE)
	return 0
}

// TestPodLimitSidecar: a pod of two containers on a shared rxe0, its
// claims consuming 3 and 2 hcaObjects. Container A holds the first claim:
// its own rdma.max is 3 objects and the hook sets the pod's cgroup to 5.
// A takes 3 PDs and is refused a fourth (EAGAIN) while the pod has room:
// its own limit holds. Container B, without a claim or a device, receives
// A's uverbs file over a unix socket and asks for 4 PDs on it: the kernel
// charges B's cgroup, under the pod's, and refuses the third (EAGAIN): the
// pod's 5 are used. Without the pod's limit B would get all 4.
func TestPodLimitSidecar(t *testing.T) {
	inGuest(t)
	skipWithoutRunc(t)
	hook := hookPath(t)
	n := startNode(t, nodeConfig{shares: 1000, hcaHandles: 64, hcaObjects: 1 << 20, hookPath: hook})
	const podUID = "6a1d3c2e-29a0-4c5e-9a7f-000000000029"
	own := n.claimForPod("pod-own", podUID, map[string]int64{"hcaObjects": 3}, "66666666-aaaa-4aaa-8aaa-000000000001")
	other := n.claimForPod("pod-other", podUID, map[string]int64{"hcaObjects": 2}, "66666666-aaaa-4aaa-8aaa-000000000002")
	ids := n.prepare(own)
	n.prepare(other)
	defer n.unprepare(own)
	defer n.unprepare(other)

	spec := withCDI(t, containerSpec("pod-a"), n.cdiDir, ids...)
	want := [][]string{{hook, "rdma-dra-hook", "limit", "--device=rxe0", "--hca-handle=max", "--hca-object=3", "--pod=" + podUID + ":max:5"}}
	if got := createRuntimeHooks(spec); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("container A's createRuntime hooks %q, want %q", got, want)
	}

	out := t.TempDir()
	release := filepath.Join(out, "release")
	if err := syscall.Mkfifo(release, 0o600); err != nil {
		t.Fatal(err)
	}
	podDir := filepath.Join("/sys/fs/cgroup", podCgroup(podUID))
	t.Cleanup(func() { os.Remove(podDir) })
	uv := "UVERBS=/dev/infiniband/" + uverbsOf(t, n.drv.Inventory(), "rxe0")
	specA := inPod(withOut(withHelper(spec, "pod-owner", uv, "N=4", "SOCK=/out/uverbs.sock", "RELEASE=/out/release"), out), podUID)
	var wg sync.WaitGroup
	var resA ctrResult
	var errA error
	wg.Add(1)
	go func() {
		defer wg.Done()
		resA, errA = runContainerErr("pod-a", specA, 120*time.Second)
	}()
	err := poll.Until(t.Context(), "container A to offer its uverbs file", 50*time.Millisecond, 60*time.Second,
		func(context.Context) (bool, string, error) {
			_, err := os.Stat(filepath.Join(out, "uverbs.sock"))
			return err == nil, fmt.Sprint(err), nil
		})
	if err != nil {
		exec.Command("runc", "--root", runcRoot, "kill", "pod-a", "KILL").Run()
		wg.Wait()
		t.Fatalf("%v: %v\n%s", err, errA, resA.out)
	}
	specB := inPod(withOut(withHelper(containerSpec("pod-b"), "pod-sidecar", "N=4", "SOCK=/out/uverbs.sock"), out), podUID)
	resB := runContainer(t, "pod-b", specB, 60*time.Second)

	cg := map[string]string{}
	for _, f := range []string{"rdma.max", "rdma.current", "pod-a/rdma.max", "pod-a/rdma.current"} {
		v, err := readTrim(filepath.Join(podDir, f))
		if err != nil {
			t.Error(err)
		}
		cg[f] = v
		t.Logf("pod's cgroup %s: %s", f, v)
	}
	if w, err := os.OpenFile(release, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		w.Close()
	} else if !errors.Is(err, syscall.ENXIO) {
		t.Error(err)
	}
	wg.Wait()
	if errA != nil {
		t.Fatal(errA)
	}
	t.Logf("container A (the claim, exit %d):\n%s", resA.exit, resA.out)
	t.Logf("container B (no claim, exit %d):\n%s", resB.exit, resB.out)
	checkPodLimit(t, resA, resB, cg)
}

func checkPodLimit(t *testing.T, a, b ctrResult, cg map[string]string) {
	t.Helper()
	eagain := "resource temporarily unavailable"
	for _, w := range []string{"owner context: ok", "owner pd 1: ok", "owner pd 2: ok", "owner pd 3: ok", "owner pd 4: " + eagain, "owner: the sidecar is done"} {
		if !strings.Contains(a.out, w) {
			t.Errorf("container A: no %q (its own limit of 3 objects, with room in the pod's 5)", w)
		}
	}
	for _, w := range []string{"sidecar: got the owner's uverbs file", "sidecar pd 1: ok", "sidecar pd 2: ok", "sidecar pd 3: " + eagain, "sidecar pd 4: " + eagain} {
		if !strings.Contains(b.out, w) {
			t.Errorf("container B: no %q (the pod's limit of 5 objects, 3 of them A's)", w)
		}
	}
	for f, w := range map[string]string{"rdma.max": "rxe0 hca_handle=max hca_object=5", "rdma.current": "rxe0 hca_handle=1 hca_object=5",
		"pod-a/rdma.max": "rxe0 hca_handle=max hca_object=3", "pod-a/rdma.current": "rxe0 hca_handle=1 hca_object=3"} {
		if !strings.Contains(cg[f], w) {
			t.Errorf("pod's cgroup %s: %q, want %q", f, cg[f], w)
		}
	}
	if a.exit != 0 || b.exit != 0 {
		t.Errorf("containers exited %d (A) and %d (B), want 0", a.exit, b.exit)
	}
}
