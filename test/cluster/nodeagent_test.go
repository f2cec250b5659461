package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

const naNode = "dgx01"

// naEnv is a control plane, a simulated dgx-h100 node with the driver
// binary on it, and the node agent playing its kubelet.
type naEnv struct {
	t      *testing.T
	ctx    context.Context
	cp     *ControlPlane
	cdiDir string
	runc   string
	proc   *DriverProcess
	agent  *NodeAgent
	// stopped: the test stopped the driver itself.
	stopped bool
}

func naStart(t *testing.T, driverArgs ...string) *naEnv {
	t.Helper()
	if ok, why := RuntimeAvailable(); !ok {
		t.Skip("runc containers unavailable (needs root and runc): " + why)
	}
	if bad := UnavailableCaps("IPC_LOCK"); len(bad) > 0 {
		t.Skipf("this host's bounding set lacks %v, which the pods ask for (run as real root, not in a restricted sandbox)", bad)
	}
	return naStartAgent(t, false, driverArgs...)
}

// naStartAgent is naStart with the agent's runtime chosen: noRuntime needs
// neither root nor runc.
func naStartAgent(t *testing.T, noRuntime bool, driverArgs ...string) *naEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := t.TempDir()
	cp, err := StartControlPlane(t, filepath.Join(dir, "cp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	binary, err := BuildDriver(dir)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := hcatest.Preset("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := hcatest.Build(filepath.Join(dir, "node"), spec)
	if err != nil {
		t.Fatal(err)
	}
	e := &naEnv{t: t, ctx: ctx, cp: cp, cdiDir: filepath.Join(dir, "cdi"), runc: filepath.Join(dir, "runc")}
	rootfs := ""
	if noRuntime {
		e.runc = ""
	} else if rootfs, err = Rootfs(dir); err != nil {
		t.Fatal(err)
	}
	kubeletDir := filepath.Join(dir, "kubelet")
	args := append([]string{
		"--node-name=" + naNode, "--kubeconfig=" + cp.Kubeconfig,
		"--sysfs-root=" + sim.SysfsRoot, "--dev-root=" + sim.DevRoot, "--cdi-root=" + e.cdiDir,
		"--kubelet-root-dir=" + kubeletDir, "--metrics-address=127.0.0.1:0", "--healthz-address=127.0.0.1:0", "-v=2",
	}, driverArgs...)
	if e.proc, err = StartDriver(binary, args...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.proc.Kill()
		if t.Failed() {
			t.Logf("driver logs:\n%s", e.proc.Logs())
		}
	})
	e.agent, err = StartNodeAgent(ctx, cp, NodeAgentConfig{
		NodeName:   naNode,
		KubeletDir: kubeletDir,
		CDIDir:     e.cdiDir,
		RuncRoot:   e.runc,
		BundleDir:  filepath.Join(dir, "bundles"),
		Rootfs:     rootfs,
		NoRuntime:  noRuntime,
		Allocatable: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("8"),
			corev1.ResourceMemory: resource.MustParse("32Gi"),
			corev1.ResourcePods:   resource.MustParse("110"),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.agent.Stop)
	return e
}

// waitFor polls cond until it holds; on timeout it fails with what cond
// last said.
func (e *naEnv) waitFor(what string, timeout time.Duration, cond func() (bool, string)) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if exited, err := e.proc.Exited(); exited && !e.stopped {
			e.t.Fatalf("driver exited (%v) while waiting for %s", err, what)
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %v waiting for %s; last: %s", timeout, what, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// claimedPod creates a claim for one HCA, a pod bound to the node that
// uses it in its only container, and then allocates the claim to device
// and reserves it for the pod, as the scheduler would.
func (e *naEnv) claimedPod(name, device string, hostNetwork bool, script string) (*corev1.Pod, *resourceapi.ResourceClaim) {
	e.t.Helper()
	c := e.cp.Client
	claim, err := c.ResourceV1().ResourceClaims("default").Create(e.ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "hca", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "hca.rdma.dra.dev"},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pod, err := c.CoreV1().Pods("default").Create(e.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:       naNode,
			HostNetwork:    hostNetwork,
			RestartPolicy:  corev1.RestartPolicyNever,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimName: &claim.Name}},
			Containers: []corev1.Container{{
				Name:      "main",
				Image:     "busybox",
				Command:   []string{"sh", "-c", script},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "rdma"}}},
				SecurityContext: &corev1.SecurityContext{
					Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"IPC_LOCK"}},
				},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "hca", Driver: "rdma.dra.dev", Pool: naNode, Device: device}},
	}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if claim, err = c.ResourceV1().ResourceClaims("default").UpdateStatus(e.ctx, claim, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return pod, claim
}

func (e *naEnv) pod(name string) *corev1.Pod {
	e.t.Helper()
	pod, err := e.cp.Client.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pod
}

func (e *naEnv) events(pod *corev1.Pod) []corev1.Event {
	e.t.Helper()
	list, err := e.cp.Client.CoreV1().Events(pod.Namespace).List(e.ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID)).String(),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return list.Items
}

func eventsText(events []corev1.Event) string {
	var b strings.Builder
	for _, ev := range events {
		fmt.Fprintf(&b, "\n  %s %s (x%d): %s", ev.Type, ev.Reason, ev.Count, ev.Message)
	}
	return b.String()
}

// runcContainers lists the containers runc knows in the agent's runc root.
func (e *naEnv) runcContainers() []string {
	e.t.Helper()
	out, err := exec.Command("runc", "--root", e.runc, "list", "-q").CombinedOutput()
	if err != nil {
		e.t.Fatalf("runc list: %v: %s", err, out)
	}
	return strings.Fields(string(out))
}

// claimSpecs lists the CDI spec files in the driver's CDI dir.
func (e *naEnv) claimSpecs() []string {
	entries, err := os.ReadDir(e.cdiDir)
	if err != nil && !os.IsNotExist(err) {
		e.t.Fatal(err)
	}
	var names []string
	for _, en := range entries {
		names = append(names, en.Name())
	}
	return names
}

// TestNodeAgent runs pods on the simulated node through the node agent
// (the kubelet's DRA manager and plugin watcher, runc): a hostNetwork pod
// gets exactly its claim's HCA and IPC_LOCK, and its claim is unprepared
// when it ends; a pod without hostNetwork is refused by the driver's
// policy, visibly, in an event.
func TestNodeAgent(t *testing.T) {
	e := naStart(t)

	node, err := e.cp.Client.CoreV1().Nodes().Get(e.ctx, naNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := false
	for _, c := range node.Status.Conditions {
		ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
	}
	if pods := node.Status.Allocatable[corev1.ResourcePods]; !ready || pods.Value() != 110 {
		t.Errorf("node %s: Ready=%v, allocatable pods %s; want Ready and 110", naNode, ready, pods.String())
	}

	// The DRA manager wipes the node's ResourceSlices when it starts (as a
	// kubelet does); the driver publishes them again.
	e.waitFor("the node's ResourceSlice", 30*time.Second, func() (bool, string) {
		list, err := e.cp.Client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, sl := range list.Items {
			if sl.Spec.Pool.Name == naNode && len(sl.Spec.Devices) == 10 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d slices", len(list.Items))
	})

	t.Run("hostNetwork", func(t *testing.T) {
		e.t = t
		// Every status the pod goes through, from before it exists.
		w, err := e.cp.Client.CoreV1().Pods("default").Watch(e.ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("metadata.name", "rdma-job").String(),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		pod, claim := e.claimedPod("rdma-job", "mlx5-3", true, "ls /dev/infiniband; grep CapEff /proc/self/status")
		e.waitFor("the pod to succeed", 2*time.Minute, func() (bool, string) {
			p := e.pod(pod.Name)
			if p.Status.Phase == corev1.PodFailed {
				t.Fatalf("pod failed: %+v\nlogs: %s\nevents:%s", p.Status, e.agent.Logs("default", pod.Name, "main"), eventsText(e.events(p)))
			}
			return p.Status.Phase == corev1.PodSucceeded, fmt.Sprintf("phase %s, events:%s", p.Status.Phase, eventsText(e.events(p)))
		})
		p := e.pod(pod.Name)
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Terminated == nil ||
			p.Status.ContainerStatuses[0].State.Terminated.ExitCode != 0 || p.Status.ContainerStatuses[0].State.Terminated.Reason != "Completed" {
			t.Errorf("container statuses = %+v", p.Status.ContainerStatuses)
		}

		// It was Running, its container running, before it succeeded.
		var phases []string
		sawRunning := false
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			phases = append(phases, string(p.Status.Phase))
			if p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil {
				sawRunning = true
			}
			if p.Status.Phase == corev1.PodSucceeded {
				break
			}
		}
		if !sawRunning {
			t.Errorf("pod never reported Running with its container running; phases seen: %v", phases)
		}

		out := e.agent.Logs("default", pod.Name, "main")
		t.Logf("container output:\n%s", out)
		ls, _, found := strings.Cut(out, "CapEff:")
		if !found {
			t.Fatalf("no CapEff in the container's output:\n%s", out)
		}
		if got := strings.TrimSpace(ls); got != "rdma_cm\nuverbs3" {
			t.Errorf("ls /dev/infiniband in the container = %q, want %q (mlx5-3's uverbs3 and rdma_cm only)", got, "rdma_cm\nuverbs3")
		}
		capEff, err := ParseCapMask(out, "CapEff")
		if err != nil {
			t.Fatal(err)
		}
		if bit := CapBit("IPC_LOCK"); bit != 14 || capEff&(1<<14) == 0 {
			t.Errorf("CapEff = %016x: IPC_LOCK (bit 14) not set", capEff)
		}

		// Unprepared after the pod ended: no CDI spec of the claim is left.
		e.waitFor("the claim's CDI spec to go", 30*time.Second, func() (bool, string) {
			specs := e.claimSpecs()
			return len(specs) == 0, fmt.Sprintf("CDI dir holds %v (claim %s)", specs, claim.UID)
		})
	})

	t.Run("deletedWhileRunning", func(t *testing.T) {
		e.t = t
		pod, _ := e.claimedPod("long", "mlx5-5", true, "sleep 3600")
		e.waitFor("the pod to run", time.Minute, func() (bool, string) {
			p := e.pod(pod.Name)
			return p.Status.Phase == corev1.PodRunning, fmt.Sprintf("phase %s, events:%s", p.Status.Phase, eventsText(e.events(p)))
		})
		// The claim's spec and the helper's device-metadata spec.
		if specs := e.claimSpecs(); len(specs) != 2 {
			t.Errorf("CDI specs while the pod runs: %v, want its claim's and its metadata's", specs)
		}
		// A graceful delete: the API server keeps the pod until the agent
		// has killed its container, unprepared its claim and deleted it.
		if err := e.cp.Client.CoreV1().Pods("default").Delete(e.ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitFor("the pod to be gone", time.Minute, func() (bool, string) {
			_, err := e.cp.Client.CoreV1().Pods("default").Get(e.ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
		if specs := e.claimSpecs(); len(specs) != 0 {
			t.Errorf("CDI specs after the pod was deleted: %v", specs)
		}
		if ids := e.runcContainers(); len(ids) != 0 {
			t.Errorf("runc containers after the pod was deleted: %v", ids)
		}
	})

	t.Run("nonHostNetworkRefused", func(t *testing.T) {
		e.t = t
		pod, _ := e.claimedPod("no-hostnet", "mlx5-4", false, "ls /dev/infiniband")
		var refusal string
		e.waitFor("a Warning event naming --allow-non-host-network", time.Minute, func() (bool, string) {
			evs := e.events(pod)
			for _, ev := range evs {
				if ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Message, "allow-non-host-network") {
					refusal = ev.Message
					return true, ""
				}
			}
			return false, "events:" + eventsText(evs)
		})
		t.Logf("refusal: %s", refusal)
		if p := e.pod(pod.Name); p.Status.Phase != corev1.PodPending {
			t.Errorf("refused pod is %s, want Pending", p.Status.Phase)
		}
		if out := e.agent.Logs("default", pod.Name, "main"); out != "" {
			t.Errorf("a refused pod's container ran: %q", out)
		}
		if specs := e.claimSpecs(); len(specs) != 0 {
			t.Errorf("CDI specs after a refused prepare: %v", specs)
		}

		// Deleting it (gracefully) ends the retries; the agent deletes it
		// for good, as the kubelet does once nothing runs and nothing is prepared.
		if err := e.cp.Client.CoreV1().Pods("default").Delete(e.ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitFor("the pod to be gone", 30*time.Second, func() (bool, string) {
			_, err := e.cp.Client.CoreV1().Pods("default").Get(e.ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	})
}

// TestNodeAgentDevicePlugin: the driver's rdma/hca device-plugin shim
// registers at the agent's kubelet.sock (the kubelet's own registration
// server and ListAndWatch client), the Node shows its capacity, a pod
// asking for rdma/hca: 1 gets every HCA through Allocate's CDI device, and
// when the plugin goes away the resource stays in capacity but leaves
// allocatable, as with the kubelet.
func TestNodeAgentDevicePlugin(t *testing.T) {
	e := naStart(t, "--sharing=shared", "--legacy=device-plugin")
	const res = corev1.ResourceName("rdma/hca")
	nodeRes := func() (capacity, allocatable int64, found bool) {
		node, err := e.cp.Client.CoreV1().Nodes().Get(e.ctx, naNode, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c, found := node.Status.Capacity[res]
		a := node.Status.Allocatable[res]
		return c.Value(), a.Value(), found
	}
	e.waitFor("rdma/hca in the node's capacity", time.Minute, func() (bool, string) {
		c, a, found := nodeRes()
		return found && c == 1000 && a == 1000, fmt.Sprintf("capacity %d, allocatable %d (present: %v)", c, a, found)
	})

	pod, err := e.cp.Client.CoreV1().Pods("default").Create(e.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy"},
		Spec: corev1.PodSpec{
			NodeName:      naNode,
			HostNetwork:   true,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name:    "main",
				Image:   "busybox",
				Command: []string{"sh", "-c", "ls /dev/infiniband; echo RDMA_DEVICES=$RDMA_DEVICES; pwd; grep ' /dev/shm ' /proc/mounts"},
				Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{res: resource.MustParse("1")},
				},
				// As the demo's legacy Job has them.
				WorkingDir:   "/root",
				VolumeMounts: []corev1.VolumeMount{{Name: "shm", MountPath: "/dev/shm"}},
			}},
			Volumes: []corev1.Volume{{Name: "shm", VolumeSource: corev1.VolumeSource{
				EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptrTo(resource.MustParse("8Gi"))},
			}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.waitFor("the rdma/hca pod to succeed", 2*time.Minute, func() (bool, string) {
		p := e.pod(pod.Name)
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod failed: %+v\nlogs: %s\nevents:%s", p.Status, e.agent.Logs("default", pod.Name, "main"), eventsText(e.events(p)))
		}
		return p.Status.Phase == corev1.PodSucceeded, fmt.Sprintf("phase %s, events:%s", p.Status.Phase, eventsText(e.events(p)))
	})
	out := e.agent.Logs("default", pod.Name, "main")
	t.Logf("container output:\n%s", out)
	ls, env, _ := strings.Cut(out, "RDMA_DEVICES=")
	want := "rdma_cm"
	for i := 0; i < 10; i++ {
		want += fmt.Sprintf("\nuverbs%d", i)
	}
	if got := strings.TrimSpace(ls); got != want {
		t.Errorf("ls /dev/infiniband with rdma/hca: 1 = %q, want every HCA: %q", got, want)
	}
	lines := strings.Split(strings.TrimSpace(env), "\n")
	if len(lines) != 3 || lines[0] == "" {
		t.Fatalf("after ls: %q, want RDMA_DEVICES, the working dir and the /dev/shm mount", lines)
	}
	if lines[1] != "/root" {
		t.Errorf("working dir = %q, want /root", lines[1])
	}
	if !strings.Contains(lines[2], " tmpfs ") || !strings.Contains(lines[2], "size=8388608k") {
		t.Errorf("/dev/shm = %q, want the 8Gi memory emptyDir", lines[2])
	}

	// The plugin goes: its devices turn unhealthy.
	e.stopped = true
	if err := e.proc.Stop(); err != nil {
		t.Fatalf("driver stop: %v", err)
	}
	e.waitFor("rdma/hca to leave allocatable", time.Minute, func() (bool, string) {
		c, a, _ := nodeRes()
		return c == 1000 && a == 0, fmt.Sprintf("capacity %d, allocatable %d", c, a)
	})
}
