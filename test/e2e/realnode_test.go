package e2e

// The driver on a real node: kubelet v1.37.2 and containerd 2.4.2 with
// runc (test/node), the driver installed by its Helm chart from the image
// `make image` builds, on a simulated DGX H100 (hcatest). The seed's Job
// goes through DRA and, with legacy.route=device-plugin, through the
// kubelet's own device manager; what the containers saw comes back as
// their logs through the API server (pods/log).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/slices"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/node"
)

func TestRealNode(t *testing.T) {
	if err := node.Check(); err != nil {
		t.Skip(err)
	}
	if _, err := node.EnsureBinaries(t.Logf); err != nil {
		t.Skipf("the node's binaries cannot be built here: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()

	image, err := node.BuildDriverImage(dir)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := hcatest.Preset("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := hcatest.Build(filepath.Join(dir, "hca"), spec)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := hca.Discover(hca.WithSysfsRoot(sim.SysfsRoot), hca.WithDevRoot(sim.DevRoot))
	if err != nil {
		t.Fatal(err)
	}
	devices := slices.Published(inv) // device name -> HCA

	cp, err := cluster.StartControlPlaneWith(t, filepath.Join(dir, "cp"), node.ControlPlaneOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	t.Cleanup(cancel) // controllers stop before the API server does
	for _, start := range []func(context.Context, *cluster.ControlPlane) error{cluster.StartControllers, cluster.StartNodeControllers, cluster.StartScheduler} {
		if err := start(ctx, cp); err != nil {
			t.Fatal(err)
		}
	}
	n, err := node.Start(ctx, t, cp, node.Options{Images: []string{image}})
	if err != nil {
		t.Fatal(err)
	}
	nodeObj, err := cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := nodeObj.Status.NodeInfo
	t.Logf("node %s: kubelet %s, runtime %s, kernel %s", n.Name, info.KubeletVersion, info.ContainerRuntimeVersion, info.KernelVersion)
	if info.KubeletVersion != "v1.37.2" || info.ContainerRuntimeVersion != "containerd://2.4.2" {
		t.Errorf("node reports kubelet %q and runtime %q, want v1.37.2 and containerd://2.4.2", info.KubeletVersion, info.ContainerRuntimeVersion)
	}

	values := func(extra string) string {
		return fmt.Sprintf(`{"image":{"tag":"dev"},"sysfsRoot":%q,"devRoot":%q%s}`, sim.SysfsRoot, sim.DevRoot, extra)
	}
	claims := watchClaims(ctx, t, cp)

	t.Run("DRA", func(t *testing.T) {
		objs := installDriver(ctx, t, cp, n, dir, "rdma", values(""))
		waitRealNode(t, "the ResourceSlice of "+n.Name, time.Minute, func() (bool, string) {
			got := sliceDevices(ctx, cp, n.Name)
			return len(got) == len(devices), fmt.Sprintf("devices %v, want %d", got, len(devices))
		})

		applyPulling(ctx, t, cp, dir, "demo/specs/10-job-dra.yaml")
		pod := waitJobPod(ctx, t, cp, "hps-benchmark")
		out := realPodLogs(ctx, t, cp, pod.Name, "hps-benchmark")
		t.Logf("hps-benchmark's log (pods/log from the kubelet):\n%s", out)
		allocated := claims.devices(pod.Name)
		if len(allocated) != 1 || devices[allocated[0]].Uverbs == nil {
			t.Fatalf("the claim of pod %s got devices %v, want one HCA (recorded: %v)", pod.Name, allocated, claims.all())
		}
		want := []string{"rdma_cm", devices[allocated[0]].Uverbs.Name}
		if got := infinibandListing(out); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("/dev/infiniband in the container = %v, want %v (claim's device %s)", got, want, allocated[0])
		}
		if capEff(t, out)&(1<<14) == 0 {
			t.Errorf("IPC_LOCK missing from CapEff:\n%s", out)
		}
		uninstallDriver(ctx, t, cp, objs)
	})

	t.Run("legacy-device-plugin", func(t *testing.T) {
		installDriver(ctx, t, cp, n, dir, "rdma-legacy", values(`,"sharing":"shared","legacy":{"route":"device-plugin"},"deviceClasses":{"create":false}`))
		waitRealNode(t, "rdma/hca on "+n.Name+" (the kubelet's device manager)", time.Minute, func() (bool, string) {
			no, err := cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			q := no.Status.Allocatable["rdma/hca"]
			return q.Value() > 0, fmt.Sprintf("allocatable %v", no.Status.Allocatable)
		})
		applyPulling(ctx, t, cp, dir, "demo/specs/20-job-legacy.yaml")
		pod := waitJobPod(ctx, t, cp, "hps-benchmark-legacy")
		out := realPodLogs(ctx, t, cp, pod.Name, "hps-benchmark")
		t.Logf("hps-benchmark-legacy's log (pods/log from the kubelet):\n%s", out)
		want := []string{"rdma_cm"}
		for _, h := range devices {
			want = append(want, h.Uverbs.Name)
		}
		got := infinibandListing(out)
		sort.Strings(got)
		sort.Strings(want)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("/dev/infiniband in the rdma/hca container = %v, want every HCA: %v", got, want)
		}
	})
}

// installDriver installs the chart and waits for the DaemonSet's pod on
// the node to be Running and Ready (its startup and readiness probes
// answered by the daemon, through the pod network).
func installDriver(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, n *node.Node, dir, release, values string) []*unstructured.Unstructured {
	t.Helper()
	start := time.Now()
	objs, err := cluster.InstallChart(ctx, cp, dir, release, "rdma-system", values)
	if err != nil {
		t.Fatal(err)
	}
	selector := "app.kubernetes.io/instance=" + release
	waitRealNode(t, "the driver pod of "+release+" to be Ready", 2*time.Minute, func() (bool, string) {
		pods, err := cp.Client.CoreV1().Pods("rdma-system").List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil || len(pods.Items) == 0 {
			return false, fmt.Sprintf("no pod yet (%v)", err)
		}
		p := pods.Items[0]
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.Status.Phase == corev1.PodRunning {
				t.Logf("driver pod %s Running and Ready on %s, %s after the install", p.Name, p.Spec.NodeName, time.Since(start).Round(10*time.Millisecond))
				return true, ""
			}
		}
		return false, fmt.Sprintf("phase %s, conditions %+v, containers %+v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
	})
	return objs
}

// uninstallDriver deletes what InstallChart created, last first, and waits
// for the driver pod to be gone (helm uninstall).
func uninstallDriver(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, objs []*unstructured.Unstructured) {
	t.Helper()
	release := ""
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			release = o.GetLabels()["app.kubernetes.io/instance"]
		}
	}
	if err := cluster.UninstallChart(ctx, cp, objs); err != nil {
		t.Fatal(err)
	}
	waitRealNode(t, "the driver pod of "+release+" to be gone", 2*time.Minute, func() (bool, string) {
		pods, err := cp.Client.CoreV1().Pods("rdma-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
		return err == nil && len(pods.Items) == 0, fmt.Sprintf("%v, %d pods", err, len(pods.Items))
	})
}

// applyPulling applies a spec file of the repository with every container
// set to imagePullPolicy IfNotPresent: there is no registry, the node has
// busybox imported (the specs use :latest, which would mean Always).
func applyPulling(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, dir, file string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cluster.RepoRoot(), file))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^(\s*)image: (.*)$`)
	patched := re.ReplaceAllString(string(b), "${1}image: $2\n${1}imagePullPolicy: IfNotPresent")
	// runc cannot grant a capability outside its own bounding set: on a
	// test machine without CAP_SYS_RESOURCE (a container), the seed's
	// SYS_RESOURCE is dropped from the spec (IPC_LOCK stays and is checked).
	if bnd, err := cluster.ParseCapMask(readStatus(t), "CapBnd"); err == nil && bnd&(1<<24) == 0 {
		t.Logf("%s: this machine's capability bounding set lacks CAP_SYS_RESOURCE; removed from the containers' capabilities", file)
		patched = regexp.MustCompile(`"SYS_RESOURCE",\s*`).ReplaceAllString(patched, "")
		patched = regexp.MustCompile(`(?m)^\s*- SYS_RESOURCE\n`).ReplaceAllString(patched, "")
	}
	out := filepath.Join(dir, filepath.Base(file))
	if err := os.WriteFile(out, []byte(patched), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.ApplyFiles(ctx, cp.Config, false, out); err != nil {
		t.Fatal(err)
	}
}

func readStatus(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitJobPod waits for the Job to complete and returns its pod.
func waitJobPod(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, name string) corev1.Pod {
	t.Helper()
	start := time.Now()
	var pod corev1.Pod
	waitRealNode(t, "job "+name+" to complete", 2*time.Minute, func() (bool, string) {
		j, err := cp.Client.BatchV1().Jobs("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pods, _ := cp.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
		for _, c := range j.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				t.Fatalf("job %s failed: %s; pods %+v", name, c.Message, pods)
			}
			if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue && pods != nil && len(pods.Items) > 0 {
				pod = pods.Items[0]
				return true, ""
			}
		}
		var st []string
		if pods != nil {
			for _, p := range pods.Items {
				st = append(st, fmt.Sprintf("%s %s %+v %+v", p.Name, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses))
			}
		}
		return false, fmt.Sprintf("%+v; pods %v", j.Status, st)
	})
	t.Logf("job %s complete %s after it was created", name, time.Since(start).Round(10*time.Millisecond))
	return pod
}

// realPodLogs is `kubectl logs`: the API server reads the container's log
// from the kubelet.
func realPodLogs(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, pod, container string) string {
	t.Helper()
	b, err := cp.Client.CoreV1().Pods("default").GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("pods/log of %s: %v", pod, err)
	}
	return string(b)
}

func sliceDevices(ctx context.Context, cp *cluster.ControlPlane, nodeName string) []string {
	list, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + nodeName})
	if err != nil {
		return nil
	}
	var names []string
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			names = append(names, d.Name)
		}
	}
	sort.Strings(names)
	return names
}

// claimRecorder keeps the devices allocated to each pod's claims (by the
// owning pod's name): a template's claim is deleted once its pod is done.
type claimRecorder struct {
	mu  sync.Mutex
	got map[string][]string
}

func (c *claimRecorder) devices(pod string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.got[pod]
}

func (c *claimRecorder) all() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.got)
}

func watchClaims(ctx context.Context, t *testing.T, cp *cluster.ControlPlane) *claimRecorder {
	t.Helper()
	w, err := cp.Client.ResourceV1().ResourceClaims("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &claimRecorder{got: map[string][]string{}}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			c, ok := ev.Object.(*resourceapi.ResourceClaim)
			if !ok || ev.Type == watch.Deleted || c.Status.Allocation == nil {
				continue
			}
			var devs []string
			for _, r := range c.Status.Allocation.Devices.Results {
				devs = append(devs, r.Device)
			}
			rec.mu.Lock()
			for _, o := range c.OwnerReferences {
				if o.Kind == "Pod" {
					rec.got[o.Name] = devs
				}
			}
			rec.mu.Unlock()
		}
	}()
	return rec
}

func waitRealNode(t *testing.T, what string, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("waiting for %s: not after %s: %s", what, d, last)
}
