package e2e

// The driver on a real node: kubelet v1.37.2 and containerd 2.4.2 with
// runc (test/node), the driver installed by its Helm chart from the image
// `make image` builds, on a simulated DGX H100 (hcatest). Here: the legacy
// rdma/hca routes; the other scenarios are in realscenarios_test.go, the
// world they share in realworld_test.go. What the containers saw comes
// back as their logs through the API server (pods/log).

import (
	"context"
	"fmt"
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

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/node"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// Both legacy routes of rdma/hca on one node, ACK's example Job unchanged
// (demo/specs/20-job-legacy.yaml): legacy.route=dra (the DeviceClass's
// extendedResourceName, the scheduler's claim for the pod) first, then
// legacy.route=device-plugin (the kubelet's own device manager). Each
// container sees every HCA. DRA goes first: once the device plugin has
// put rdma/hca into the Node's allocatable, the scheduler would keep
// serving rdma/hca from there.
func TestRealNodeLegacy(t *testing.T) {
	t.Parallel() // a real node of its own: see parallel in main_test.go
	w := newRealWorld(t)
	want := []string{"rdma_cm"}
	for _, h := range w.devices {
		want = append(want, h.Uverbs.Name)
	}
	sort.Strings(want)
	check := func(t *testing.T, out string) {
		t.Helper()
		got := infinibandListing(out)
		sort.Strings(got)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("/dev/infiniband in the rdma/hca container = %v, want every HCA: %v", got, want)
		}
	}

	t.Run("legacy-dra", func(t *testing.T) {
		start := time.Now()
		w.install(t, "rdma-legacy-dra", `,"sharing":"shared","legacy":{"route":"dra"}`)
		applyPulling(w.ctx, t, w.cp, w.dir, "demo/specs/20-job-legacy.yaml")
		pod := waitJobPod(w.ctx, t, w.cp, "hps-benchmark-legacy")
		out := realPodLogs(w.ctx, t, w.cp, pod.Name, "hps-benchmark")
		t.Logf("hps-benchmark-legacy's log (pods/log from the kubelet):\n%s", out)
		check(t, out)
		if pod.Status.ExtendedResourceClaimStatus == nil {
			t.Errorf("pod has no extendedResourceClaimStatus: the scheduler did not map rdma/hca to a claim")
		} else {
			t.Logf("rdma/hca served by the scheduler's claim %s", pod.Status.ExtendedResourceClaimStatus.ResourceClaimName)
		}
		w.reset(t)
		w.uninstall(t)
		t.Logf("legacy-dra: %s", time.Since(start).Round(100*time.Millisecond))
	})

	t.Run("legacy-device-plugin", func(t *testing.T) {
		start := time.Now()
		w.release = "rdma-legacy"
		w.objs = installDriver(w.ctx, t, w.cp, w.n, w.dir, w.release, w.values(`,"sharing":"shared","legacy":{"route":"device-plugin"},"deviceClasses":{"create":false}`))
		poll.For(t, "rdma/hca on "+w.n.Name+" (the kubelet's device manager)", time.Minute, func() (bool, string) {
			no, err := w.cp.Client.CoreV1().Nodes().Get(w.ctx, w.n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			q := no.Status.Allocatable["rdma/hca"]
			return q.Value() > 0, fmt.Sprintf("allocatable %v", no.Status.Allocatable)
		})
		applyPulling(w.ctx, t, w.cp, w.dir, "demo/specs/20-job-legacy.yaml")
		pod := waitJobPod(w.ctx, t, w.cp, "hps-benchmark-legacy")
		out := realPodLogs(w.ctx, t, w.cp, pod.Name, "hps-benchmark")
		t.Logf("hps-benchmark-legacy's log (pods/log from the kubelet):\n%s", out)
		check(t, out)
		if pod.Status.ExtendedResourceClaimStatus != nil {
			t.Errorf("the device-plugin route's pod has an extendedResourceClaimStatus %+v: served by DRA, not the device manager", pod.Status.ExtendedResourceClaimStatus)
		}
		t.Logf("legacy-device-plugin: %s", time.Since(start).Round(100*time.Millisecond))
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
	poll.For(t, "the driver pod of "+release+" to be Ready", 2*time.Minute, func() (bool, string) {
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
	poll.For(t, "the driver pod of "+release+" to be gone", 2*time.Minute, func() (bool, string) {
		pods, err := cp.Client.CoreV1().Pods("rdma-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
		return err == nil && len(pods.Items) == 0, fmt.Sprintf("%v, %d pods", err, len(pods.Items))
	})
}

// applyPulling applies a spec file of the repository with every container
// set to imagePullPolicy IfNotPresent: there is no registry, the node has
// busybox imported (the specs use :latest, which would mean Always).
func applyPulling(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, dir, file string) {
	t.Helper()
	note, err := node.ApplySpec(ctx, cp, dir, file)
	if err != nil {
		t.Fatal(err)
	}
	if note != "" {
		t.Log(note)
	}
}

// waitJobPod waits for the Job to complete and returns its pod.
func waitJobPod(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, name string) corev1.Pod {
	t.Helper()
	start := time.Now()
	var pod corev1.Pod
	poll.For(t, "job "+name+" to complete", 2*time.Minute, func() (bool, string) {
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
