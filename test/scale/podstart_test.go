package scale

// Pod start latency by route on a real node (kubelet v1.37.2, containerd
// 2.4.2, runc; test/node): create -> Running of one pod at a time, with no
// device, with a DRA claim, and with rdma/hca through the device-plugin
// route and through a DeviceClass's extendedResourceName. What a route
// costs beyond "no device" is what the driver (and the kubelet's handling of
// its API) adds.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/node"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// BenchmarkPodStart: PODSTART_PODS pods (default 50) per route, one at a
// time. Run with -benchtime=1x.
func BenchmarkPodStart(b *testing.B) {
	if err := node.Check(); err != nil {
		b.Skip(err)
	}
	if _, err := node.EnsureBinaries(b.Logf); err != nil {
		b.Skipf("the node's binaries cannot be built here: %v", err)
	}
	pods := 50
	if p := envInts(b, "PODSTART_PODS", nil); len(p) > 0 {
		pods = p[0]
	}
	for b.Loop() {
		runPodStart(b, pods)
	}
}

type route struct {
	name string
	pod  func(name string) *corev1.Pod
}

func runPodStart(b *testing.B, pods int) {
	ctx, cancel := context.WithCancel(context.Background())
	dir, err := os.MkdirTemp("", "podstart")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	image, err := node.BuildDriverImage(dir)
	if err != nil {
		b.Fatal(err)
	}
	spec, _ := hcatest.Preset("dgx-h100")
	sim, err := hcatest.Build(filepath.Join(dir, "hca"), spec)
	if err != nil {
		b.Fatal(err)
	}
	cp, err := cluster.StartControlPlaneWith(b, filepath.Join(dir, "cp"), node.ControlPlaneOptions())
	if err != nil {
		b.Fatal(err)
	}
	defer cp.Stop()
	defer cancel() // components stop before the API server
	for _, start := range []func(context.Context, *cluster.ControlPlane) error{cluster.StartControllers, cluster.StartNodeControllers, cluster.StartScheduler} {
		if err := start(ctx, cp); err != nil {
			b.Fatal(err)
		}
	}
	n, err := node.Start(ctx, b, cp, node.Options{Images: []string{image}})
	if err != nil {
		b.Fatal(err)
	}
	c := cp.Client

	busybox := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: corev1.PodSpec{HostNetwork: true, TerminationGracePeriodSeconds: ptr(int64(0)),
				Containers: []corev1.Container{{Name: "c", Image: "busybox", ImagePullPolicy: corev1.PullIfNotPresent,
					Command: []string{"sleep", "3600"}}}}}
	}
	rdmaHCA := func(name string) *corev1.Pod {
		p := busybox(name)
		one := corev1.ResourceList{"rdma/hca": resource.MustParse("1")}
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: one, Limits: one}
		return p
	}
	template := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "one-hca", Namespace: namespace},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{request("hca", "hca.rdma.dra.dev", 1)}}}}}
	if _, err := c.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, template, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	dra := func(name string) *corev1.Pod {
		p := busybox(name)
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimTemplateName: ptr("one-hca")}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "rdma"}}
		return p
	}

	// The same claim made beforehand: what is left when the resourceclaim
	// controller's turn (creating the claim from the template) is taken out.
	precreated := func(name string) *corev1.Pod {
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: template.Spec.Spec}
		if _, err := c.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		p := busybox(name)
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimName: &claim.Name}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "rdma"}}
		return p
	}

	memlock, _, err := cluster.HostMemlock()
	if err != nil {
		b.Fatal(err)
	}
	values := func(route string) string {
		return fmt.Sprintf(`{"image":{"tag":"dev"},"sysfsRoot":%q,"devRoot":%q,"sharing":"shared","legacy":{"route":%q},"memlock":%q}`, sim.SysfsRoot, sim.DevRoot, route, memlock)
	}
	var results []podStartResult
	objs := install(ctx, b, cp, n, dir, "rdma-dp", values("device-plugin"))
	for _, r := range []route{{"no-device", busybox}, {"dra-claim", dra}, {"dra-claim-precreated", precreated}, {"rdma-hca-device-plugin", rdmaHCA}} {
		results = append(results, timePods(ctx, b, cp, r, pods))
	}
	if err := cluster.UninstallChart(ctx, cp, objs); err != nil {
		b.Fatal(err)
	}
	waitGone(ctx, b, cp)
	install(ctx, b, cp, n, dir, "rdma-dra", values("dra"))
	results = append(results, timePods(ctx, b, cp, route{"rdma-hca-extended-resource", rdmaHCA}, pods))
	reportPodStart(b, pods, results)
}

// install installs the chart and waits for its daemon to be Ready and to
// have published (and, on the device-plugin route, for rdma/hca on the node).
func install(ctx context.Context, b *testing.B, cp *cluster.ControlPlane, n *node.Node, dir, release, values string) []*unstructured.Unstructured {
	objs, err := cluster.InstallChart(ctx, cp, dir, release, "rdma-system", values)
	if err != nil {
		b.Fatal(err)
	}
	waitUntil(ctx, b, "the driver of "+release+" Ready with its slice", func() bool {
		pods, err := cp.Client.CoreV1().Pods("rdma-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
		if err != nil || len(pods.Items) == 0 || !podReady(&pods.Items[0]) {
			return false
		}
		l, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) == 0 {
			return false
		}
		if strings.Contains(values, "device-plugin") {
			no, err := cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			q := no.Status.Allocatable["rdma/hca"]
			return err == nil && q.Value() > 0
		}
		return true
	})
	return objs
}

func waitGone(ctx context.Context, b *testing.B, cp *cluster.ControlPlane) {
	waitUntil(ctx, b, "the driver pods to be gone", func() bool {
		pods, err := cp.Client.CoreV1().Pods("rdma-system").List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func waitUntil(ctx context.Context, b *testing.B, what string, cond func() bool) {
	err := poll.Until(ctx, what, 100*time.Millisecond, 3*time.Minute, func(context.Context) (bool, string, error) {
		return cond(), "", nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

type podStartResult struct {
	route    string
	p50, p99 time.Duration
}

// timePods starts n pods of a route one after the other: each is created,
// seen Running (its container started) through a watch, then deleted.
func timePods(ctx context.Context, b *testing.B, cp *cluster.ControlPlane, r route, n int) podStartResult {
	c := cp.Client.CoreV1().Pods(namespace)
	var lat []time.Duration
	for i := range n {
		name := fmt.Sprintf("%s-%d", r.name, i)
		w, err := c.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
		if err != nil {
			b.Fatal(err)
		}
		pod := r.pod(name) // a precreated claim is made here, before the clock starts
		start := time.Now()
		if _, err := c.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		running := false
		timeout := time.After(2 * time.Minute)
		for !running {
			select {
			case ev := <-w.ResultChan():
				if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted && p.Status.Phase == corev1.PodRunning {
					running = true
				}
			case <-timeout:
				p, _ := c.Get(ctx, name, metav1.GetOptions{})
				b.Fatalf("route %s: pod %s not Running after 2 minutes: %+v", r.name, name, p.Status)
			}
		}
		lat = append(lat, time.Since(start))
		w.Stop()
		if err := c.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
			b.Fatal(err)
		}
		waitUntil(ctx, b, "pod "+name+" to be gone", func() bool {
			_, err := c.Get(ctx, name, metav1.GetOptions{})
			return err != nil
		})
		_ = cp.Client.ResourceV1().ResourceClaims(namespace).Delete(ctx, name, metav1.DeleteOptions{}) // a precreated claim
	}
	slices.Sort(lat)
	return podStartResult{route: r.name, p50: lat[len(lat)/2], p99: lat[(len(lat)*99)/100]}
}

func reportPodStart(b *testing.B, pods int, results []podStartResult) {
	base := results[0]
	var dp time.Duration
	for _, r := range results {
		if r.route == "rdma-hca-device-plugin" {
			dp = r.p50
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\npod create -> Running on a real node, %d pods per route, one at a time\n", pods)
	fmt.Fprintf(&sb, "%-28s %9s %9s %12s %16s\n", "route", "p50", "p99", "x no-device", "x device-plugin")
	for _, r := range results {
		fmt.Fprintf(&sb, "%-28s %9v %9v %12.2f %16.2f\n", r.route, r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond),
			float64(r.p50)/float64(base.p50), float64(r.p50)/float64(dp))
		b.ReportMetric(float64(r.p50.Milliseconds()), r.route+"-p50-ms")
		b.ReportMetric(float64(r.p99.Milliseconds()), r.route+"-p99-ms")
	}
	fmt.Print(sb.String())
}
