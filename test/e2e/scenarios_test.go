package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

// world is an in-process control plane around one simulated dgx-h100 node
// and the driver binary built for it. newWorld adds the controllers, the
// scheduler and a node agent (the kubelet); with newBareWorld the test
// itself plays the kubelet on the driver's sockets.
type world struct {
	t          *testing.T
	cp         *cluster.ControlPlane
	agent      *cluster.NodeAgent
	binary     string
	args       []string
	kubeletDir string
	cdiDir     string
	proc       *cluster.DriverProcess
	sim        *hcatest.Node
	dir        string
}

func newBareWorld(t *testing.T, driverArgs ...string) *world {
	t.Helper()
	dir, err := os.MkdirTemp("", "w") // short: unix socket paths live under it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cp, err := cluster.StartControlPlane(t, filepath.Join(dir, "cp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	spec, _ := hcatest.Preset("dgx-h100")
	sim, err := hcatest.Build(filepath.Join(dir, "node"), spec)
	if err != nil {
		t.Fatal(err)
	}
	binary, err := cluster.BuildDriver(dir)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, cp: cp, binary: binary, cdiDir: filepath.Join(dir, "cdi"), kubeletDir: filepath.Join(dir, "k"), sim: sim, dir: dir}
	w.args = append([]string{"--node-name=" + nodeName, "--kubeconfig=" + cp.Kubeconfig,
		"--sysfs-root=" + sim.SysfsRoot, "--dev-root=" + sim.DevRoot, "--cdi-root=" + w.cdiDir,
		"--kubelet-root-dir=" + w.kubeletDir, "--metrics-address=127.0.0.1:0", "--healthz-address=127.0.0.1:0"}, driverArgs...)
	t.Cleanup(func() {
		if w.proc != nil {
			if t.Failed() {
				t.Logf("driver logs:\n%s", w.proc.Logs())
			}
			w.proc.Kill()
		}
	})
	return w
}

func newWorld(t *testing.T, driverArgs ...string) *world {
	t.Helper()
	if ok, why := cluster.RuntimeAvailable(); !ok {
		t.Skipf("runc containers unavailable (needs root and runc): %s", why)
	}
	w := newBareWorld(t, driverArgs...)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := cluster.StartControllers(ctx, w.cp); err != nil {
		t.Fatal(err)
	}
	if err := cluster.StartScheduler(ctx, w.cp); err != nil {
		t.Fatal(err)
	}
	w.startDriver()
	rootfs, err := cluster.Rootfs(filepath.Join(w.dir, "rootfs"))
	if err != nil {
		t.Fatal(err)
	}
	w.agent, err = cluster.StartNodeAgent(ctx, w.cp, cluster.NodeAgentConfig{
		NodeName: nodeName, KubeletDir: w.kubeletDir, CDIDir: w.cdiDir,
		RuncRoot: filepath.Join(w.dir, "runc"), BundleDir: filepath.Join(w.dir, "b"), Rootfs: rootfs,
		Allocatable: corev1.ResourceList{"cpu": resource.MustParse("64"), "memory": resource.MustParse("512Gi"), "pods": resource.MustParse("110")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.agent.Stop)
	root := cluster.RepoRoot()
	if _, err := cluster.ApplyFiles(ctx, w.cp.Config, false, filepath.Join(root, "deployments", "deviceclasses.yaml"),
		filepath.Join(root, "deployments", "deviceclass-legacy.yaml")); err != nil {
		t.Fatal(err)
	}
	w.wait("the node's ResourceSlice", time.Minute, func() (bool, string) {
		l, err := w.cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) > 0 && len(l.Items[0].Spec.Devices) >= 10, fmt.Sprint(err)
	})
	return w
}

func (w *world) startDriver() {
	w.t.Helper()
	p, err := cluster.StartDriver(w.binary, w.args...)
	if err != nil {
		w.t.Fatal(err)
	}
	w.proc = p
}

// wait polls cond until it holds; a driver that exits meanwhile fails the
// test at once, with its logs.
func (w *world) wait(what string, d time.Duration, cond func() (bool, string)) {
	w.t.Helper()
	waitFor(w.t, what, d, func() (bool, string) {
		if w.proc != nil {
			if exited, err := w.proc.Exited(); exited {
				w.t.Fatalf("driver exited (%v) while waiting for %s:\n%s", err, what, w.proc.Logs())
			}
		}
		return cond()
	})
}

func (w *world) apply(files ...string) {
	w.t.Helper()
	var paths []string
	for _, f := range files {
		paths = append(paths, filepath.Join(cluster.RepoRoot(), f))
	}
	if _, err := cluster.ApplyFiles(context.Background(), w.cp.Config, false, paths...); err != nil {
		w.t.Fatal(err)
	}
}

// jobPod waits for the Job to complete and returns its pod.
func (w *world) jobPod(name string) corev1.Pod {
	w.t.Helper()
	ctx := context.Background()
	var pod corev1.Pod
	w.wait("job "+name+" to complete", 2*time.Minute, func() (bool, string) {
		j, err := w.cp.Client.BatchV1().Jobs("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range j.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				w.t.Fatalf("job %s failed: %s", name, c.Message)
			}
			if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
				pods, err := w.cp.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
				if err == nil && len(pods.Items) > 0 {
					pod = pods.Items[0]
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("%+v", j.Status)
	})
	return pod
}

func infinibandListing(out string) []string {
	var names []string
	for _, l := range strings.Split(out, "\n") {
		if l == "rdma_cm" || strings.HasPrefix(l, "uverbs") || strings.HasPrefix(l, "umad") || strings.HasPrefix(l, "issm") {
			names = append(names, l)
		}
	}
	return names
}

func capEff(t *testing.T, out string) uint64 {
	t.Helper()
	m, err := cluster.ParseCapMask(out, "CapEff")
	if err != nil {
		t.Fatalf("no CapEff in output %q: %v", out, err)
	}
	return m
}

// Scenario 1 and 3 and 6 share an exclusive node.
func TestScenariosExclusiveNode(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()

	t.Run("1-seed-job-for-DRA", func(t *testing.T) {
		w.apply("demo/specs/10-job-dra.yaml")
		pod := w.jobPod("hps-benchmark")
		out := w.agent.Logs("default", pod.Name, "hps-benchmark")
		got := infinibandListing(out)
		if len(got) != 2 || got[0] != "rdma_cm" || !strings.HasPrefix(got[1], "uverbs") {
			t.Errorf("/dev/infiniband = %v, want rdma_cm and exactly one uverbsN\n%s", got, out)
		}
		if capEff(t, out)&(1<<14) == 0 {
			t.Errorf("IPC_LOCK missing from CapEff:\n%s", out)
		}
	})

	t.Run("3-pcie-root-pair", func(t *testing.T) {
		w.apply("demo/specs/30-claim-pcie-pair.yaml")
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "pair", Namespace: "default"},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, HostNetwork: true,
				ResourceClaims: []corev1.PodResourceClaim{{Name: "hcas", ResourceClaimName: ptr("hca-pair")}},
				Containers: []corev1.Container{{Name: "c", Image: "busybox", Command: []string{"sh", "-c", "ls /dev/infiniband; sleep 3"},
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "hcas"}}}}}},
		}
		if _, err := w.cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var claim *resourceapi.ResourceClaim
		w.wait("the pair claim to be allocated", time.Minute, func() (bool, string) {
			c, err := w.cp.Client.ResourceV1().ResourceClaims("default").Get(ctx, "hca-pair", metav1.GetOptions{})
			claim = c
			p, _ := w.cp.Client.CoreV1().Pods("default").Get(ctx, "pair", metav1.GetOptions{})
			return err == nil && c.Status.Allocation != nil, fmt.Sprintf("%v; pod conditions %+v", err, p.Status.Conditions)
		})
		roots := map[string]string{"mlx5-0": "pci0000:15", "mlx5-1": "pci0000:15", "mlx5-2": "pci0000:3e", "mlx5-3": "pci0000:3e",
			"mlx5-4": "pci0000:9a", "mlx5-5": "pci0000:9a", "mlx5-6": "pci0000:c0", "mlx5-7": "pci0000:c0"}
		res := claim.Status.Allocation.Devices.Results
		if len(res) != 2 || res[0].Device == res[1].Device || roots[res[0].Device] == "" || roots[res[0].Device] != roots[res[1].Device] {
			t.Errorf("pair = %+v, want two IB HCAs on one PCIe root", res)
		}
		w.wait("the pair pod to succeed", time.Minute, func() (bool, string) {
			p, err := w.cp.Client.CoreV1().Pods("default").Get(ctx, "pair", metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodSucceeded, fmt.Sprint(err)
		})
		if got := infinibandListing(w.agent.Logs("default", "pair", "c")); len(got) != 3 {
			t.Errorf("pair container sees %v, want rdma_cm and two uverbs", got)
		}
	})

	t.Run("6-hostNetwork-policy", func(t *testing.T) {
		pod := claimPod("podnet", false, "sleep 1")
		w.createClaimPod(pod)
		w.wait("the refusal event", time.Minute, func() (bool, string) {
			evs, err := w.cp.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=podnet"})
			if err != nil {
				return false, err.Error()
			}
			for _, e := range evs.Items {
				if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "does not use hostNetwork") && strings.Contains(e.Message, "--allow-non-host-network") {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d events", len(evs.Items))
		})
		if p, _ := w.cp.Client.CoreV1().Pods("default").Get(ctx, "podnet", metav1.GetOptions{}); p.Status.Phase != corev1.PodPending {
			t.Errorf("refused pod is %s, want Pending", p.Status.Phase)
		}
		zero := int64(0)
		_ = w.cp.Client.CoreV1().Pods("default").Delete(ctx, "podnet", metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
}

func ptr[T any](v T) *T { return &v }

// claimPod is a pod with its own claim from the ib-400g template (created
// by the seed job spec) running a shell command.
func claimPod(name string, hostNetwork bool, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, HostNetwork: hostNetwork,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimTemplateName: ptr("ib-400g")}},
			Containers: []corev1.Container{{Name: "c", Image: "busybox", Command: []string{"sh", "-c", script},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "rdma"}}}}}},
	}
}

func (w *world) createClaimPod(pod *corev1.Pod) {
	w.t.Helper()
	if _, err := w.cp.Client.ResourceV1().ResourceClaimTemplates("default").Get(context.Background(), "ib-400g", metav1.GetOptions{}); err != nil {
		w.apply("demo/specs/10-job-dra.yaml")
	}
	if _, err := w.cp.Client.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// Scenario 2: eight pods get eight distinct HCAs, a ninth waits for one.
func TestScenarioEightThenNine(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	for i := range 8 {
		w.createClaimPod(claimPod(fmt.Sprintf("p%d", i), true, "sleep 20; ls /dev/infiniband")) // long enough to outlast the checks below
	}
	w.wait("eight pods running", 2*time.Minute, func() (bool, string) {
		n := 0
		for i := range 8 {
			p, err := w.cp.Client.CoreV1().Pods("default").Get(ctx, fmt.Sprintf("p%d", i), metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning {
				n++
			}
		}
		return n == 8, fmt.Sprintf("%d running", n)
	})
	w.createClaimPod(claimPod("p8", true, "ls /dev/infiniband"))
	// The scheduler's verdict, not a guess at how long it takes.
	w.wait("the ninth pod to be found unschedulable", time.Minute, func() (bool, string) {
		p, err := w.cp.Client.CoreV1().Pods("default").Get(ctx, "p8", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("ninth pod placed on %q while eight HCAs are taken", p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, ""
			}
		}
		return false, fmt.Sprintf("conditions %+v", p.Status.Conditions)
	})
	var devices []string
	claims, _ := w.cp.Client.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
	for _, c := range claims.Items {
		if c.Status.Allocation != nil {
			devices = append(devices, c.Status.Allocation.Devices.Results[0].Device)
		}
	}
	slices.Sort(devices)
	if strings.Join(devices, ",") != "mlx5-0,mlx5-1,mlx5-2,mlx5-3,mlx5-4,mlx5-5,mlx5-6,mlx5-7" {
		t.Errorf("allocated devices = %v, want the eight distinct IB HCAs", devices)
	}
	w.wait("the ninth pod to run after one finished", 2*time.Minute, func() (bool, string) {
		p, err := w.cp.Client.CoreV1().Pods("default").Get(ctx, "p8", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodSucceeded, fmt.Sprint(err)
	})
}

// Scenario 4: legacy route 1, the device-plugin shim.
func TestScenarioLegacyDevicePlugin(t *testing.T) {
	w := newWorld(t, "--sharing=shared", "--legacy=device-plugin")
	ctx := context.Background()
	w.wait("rdma/hca: 1k in the Node's allocatable", time.Minute, func() (bool, string) {
		n, err := w.cp.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		q := n.Status.Allocatable["rdma/hca"]
		return q.String() == "1k", q.String()
	})
	w.apply("demo/specs/20-job-legacy.yaml")
	pod := w.jobPod("hps-benchmark-legacy")
	got := infinibandListing(w.agent.Logs("default", pod.Name, "hps-benchmark"))
	if len(got) != 11 || got[0] != "rdma_cm" {
		t.Errorf("legacy container sees %v, want rdma_cm and all ten uverbs", got)
	}
}

// Scenario 5: legacy route 2, extendedResourceName on a shared node.
func TestScenarioLegacyDRA(t *testing.T) {
	w := newWorld(t, "--sharing=shared", "--legacy=dra")
	w.apply("demo/specs/20-job-legacy.yaml")
	pod := w.jobPod("hps-benchmark-legacy")
	got := infinibandListing(w.agent.Logs("default", pod.Name, "hps-benchmark"))
	if len(got) != 11 || got[0] != "rdma_cm" {
		t.Errorf("legacy container sees %v, want rdma_cm and all ten uverbs", got)
	}
	if pod.Status.ExtendedResourceClaimStatus == nil {
		t.Errorf("pod has no extendedResourceClaimStatus: the scheduler did not map rdma/hca to a claim")
	}
}

// Scenario 7: SIGKILL the driver while pods run; they finish, every CDI
// spec is cleaned up, no HCA is held by two exclusive claims.
func TestScenarioDriverSIGKILL(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	for i := range 4 {
		w.createClaimPod(claimPod(fmt.Sprintf("k%d", i), true, "ls /dev/infiniband; sleep 600"))
	}
	w.wait("four pods running", 2*time.Minute, func() (bool, string) {
		n := 0
		for i := range 4 {
			if p, err := w.cp.Client.CoreV1().Pods("default").Get(ctx, fmt.Sprintf("k%d", i), metav1.GetOptions{}); err == nil && p.Status.Phase == corev1.PodRunning {
				n++
			}
		}
		return n == 4, fmt.Sprintf("%d running", n)
	})
	w.proc.Kill()
	w.startDriver()
	// What the killed daemon prepared is on disk for its successor.
	cp, err := checkpoint.NewStore(filepath.Join(w.kubeletDir, "plugins", "rdma.dra.dev", "checkpoint.json")).Load()
	if err != nil {
		t.Fatal(err)
	}
	var names, want []string
	for _, c := range cp.Claims {
		if strings.HasPrefix(c.Name, "k") { // not the Job of demo/specs
			names = append(names, c.Name)
		}
	}
	for i := range 4 {
		p, err := w.cp.Client.CoreV1().Pods("default").Get(ctx, fmt.Sprintf("k%d", i), metav1.GetOptions{})
		if err != nil || len(p.Status.ResourceClaimStatuses) != 1 {
			t.Fatalf("pod k%d: %v %+v", i, err, p.Status.ResourceClaimStatuses)
		}
		want = append(want, *p.Status.ResourceClaimStatuses[0].ResourceClaimName)
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("checkpoint after SIGKILL holds claims %v, want the four running pods' %v", names, want)
	}
	for i := 4; i < 8; i++ {
		w.createClaimPod(claimPod(fmt.Sprintf("k%d", i), true, "ls /dev/infiniband"))
	}
	w.wait("pods k4-k7 to succeed", 2*time.Minute, func() (bool, string) {
		n := 0
		for i := 4; i < 8; i++ {
			if p, err := w.cp.Client.CoreV1().Pods("default").Get(ctx, fmt.Sprintf("k%d", i), metav1.GetOptions{}); err == nil && p.Status.Phase == corev1.PodSucceeded {
				n++
			}
		}
		return n == 4, fmt.Sprintf("%d succeeded", n)
	})
	for i := range 4 {
		if err := w.cp.Client.CoreV1().Pods("default").Delete(ctx, fmt.Sprintf("k%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w.wait("k0-k3 to end", time.Minute, func() (bool, string) {
		l, err := w.cp.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, p := range l.Items {
			if strings.HasPrefix(p.Name, "k") && p.Name < "k4" {
				left = append(left, p.Name)
			}
		}
		return len(left) == 0, strings.Join(left, " ")
	})
	// k4-k7 ran while k0-k3 held their HCAs: all eight saw distinct ones.
	seen := map[string]string{}
	for i := range 8 {
		got := infinibandListing(w.agent.Logs("default", fmt.Sprintf("k%d", i), "c"))
		if len(got) != 2 {
			t.Errorf("k%d sees %v, want rdma_cm and one uverbs", i, got)
		}
		for _, d := range got {
			if d == "rdma_cm" {
				continue
			}
			if other, dup := seen[d]; dup {
				t.Errorf("%s seen by k%d and %s while both ran", d, i, other)
			}
			seen[d] = fmt.Sprintf("k%d", i)
		}
	}
	w.wait("every CDI spec to be cleaned up", time.Minute, func() (bool, string) {
		entries, _ := os.ReadDir(w.cdiDir)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return len(entries) == 0, strings.Join(names, " ")
	})
}

// Health: with seven of the eight InfiniBand ports DOWN, a new claim gets
// the one healthy IB HCA: the port-down taints keep the scheduler off the rest.
//
// A pod already running on one of those HCAs keeps it, and its status shows
// the health the kubelet received from the driver: Healthy first, then
// Unhealthy with the port named.
func TestScenarioPortDownKeepsPodsOff(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.createClaimPod(claimPod("victim", true, "sleep 600"))
	var victimDevice string
	w.wait("the victim pod running", 2*time.Minute, func() (bool, string) {
		p, err := w.cp.Client.CoreV1().Pods("default").Get(ctx, "victim", metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning || len(p.Status.ResourceClaimStatuses) == 0 {
			return false, fmt.Sprint(err)
		}
		c, err := w.cp.Client.ResourceV1().ResourceClaims("default").Get(ctx, *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		if err != nil || c.Status.Allocation == nil {
			return false, fmt.Sprint(err)
		}
		victimDevice = c.Status.Allocation.Devices.Results[0].Device
		return true, ""
	})
	if victimDevice == "mlx5-7" {
		t.Fatal("the victim got mlx5-7, the HCA this test keeps healthy; the allocator's order changed")
	}
	w.wait("the victim's status to show its HCA Healthy", time.Minute, func() (bool, string) {
		h, msg := podDeviceHealth(ctx, w, "victim")
		return h == corev1.ResourceHealthStatusHealthy, fmt.Sprintf("%s %q", h, msg)
	})
	for i := range 7 {
		if err := w.sim.SetPortState(fmt.Sprintf("mlx5_%d", i), 1, "1: DOWN", "2: Polling"); err != nil {
			t.Fatal(err)
		}
	}
	w.wait("seven tainted devices", time.Minute, func() (bool, string) {
		l, err := w.cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, s := range l.Items {
			for _, d := range s.Spec.Devices {
				if len(d.Taints) > 0 && d.Taints[0].Key == "rdma.dra.dev/port-down" {
					n++
				}
			}
		}
		return n == 7, fmt.Sprintf("%d tainted", n)
	})
	wantMsg := strings.ReplaceAll(victimDevice, "-", "_") + ": port 1 is DOWN (Polling)"
	w.wait("the victim's status to show its HCA Unhealthy", time.Minute, func() (bool, string) {
		h, msg := podDeviceHealth(ctx, w, "victim")
		return h == corev1.ResourceHealthStatusUnhealthy && msg == wantMsg, fmt.Sprintf("%s %q, want Unhealthy %q", h, msg, wantMsg)
	})
	w.createClaimPod(claimPod("healthy", true, "ls /dev/infiniband"))
	w.wait("the pod to succeed", 2*time.Minute, func() (bool, string) {
		p, err := w.cp.Client.CoreV1().Pods("default").Get(ctx, "healthy", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodSucceeded, fmt.Sprint(err)
	})
	got := infinibandListing(w.agent.Logs("default", "healthy", "c"))
	if strings.Join(got, " ") != "rdma_cm uverbs7" {
		t.Errorf("pod sees %v, want the one healthy IB HCA (uverbs7)", got)
	}
}

// podDeviceHealth is the health and message of the one device of the pod's
// claim "rdma", from the container's allocatedResourcesStatus.
func podDeviceHealth(ctx context.Context, w *world, name string) (corev1.ResourceHealthStatus, string) {
	p, err := w.cp.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil || len(p.Status.ContainerStatuses) == 0 {
		return "", fmt.Sprint(err)
	}
	for _, rs := range p.Status.ContainerStatuses[0].AllocatedResourcesStatus {
		if rs.Name != "claim:rdma" || len(rs.Resources) != 1 {
			continue
		}
		msg := ""
		if m := rs.Resources[0].Message; m != nil {
			msg = *m
		}
		return rs.Resources[0].Health, msg
	}
	return "", fmt.Sprintf("no claim:rdma entry in %+v", p.Status.ContainerStatuses[0].AllocatedResourcesStatus)
}
