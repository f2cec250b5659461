// Package scale measures how the real kube-scheduler copes with many
// richly attributed RDMA nodes: the ResourceSlices of N simulated nodes
// (8 ConnectX-7 + 2 BlueField-3 each, rendered by pkg/slices from a real
// discovery of the simulated dgx-h100 node), beside a GPU driver's slices
// (8 GPUs per node on the same PCIe roots) and a baseline driver's devices
// with one attribute. It is a benchmark, run by `make bench-scale`; it
// asserts only what makes its figures meaningful (every pod bound, every
// slice accepted by the API server).
package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	rslices "github.com/rdma-dra/rdma-dra-driver/pkg/slices"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

const (
	gpuDriver      = "gpu.example.com"
	baselineDriver = "baseline.example.com"
	namespace      = "default"
)

// pcieRoots are the dgx-h100 preset's four PCIe roots with two IB HCAs
// each; the GPU driver puts two GPUs behind each.
var pcieRoots = []string{"pci0000:15", "pci0000:3e", "pci0000:9a", "pci0000:c0"}

// shape is one kind of pod: what its claim asks for.
type shape struct {
	name string
	// claim is the pod's claim spec; nil for the extended-resource shape.
	claim *resourceapi.ResourceClaimSpec
	// extended is the pod's rdma/hca request instead of a claim.
	extended bool
}

func request(name, class string, count int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
}

var shapes = []shape{
	{name: "baseline", claim: &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{request("dev", "baseline", 1)}}}},
	{name: "one-hca", claim: &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{request("hca", "hca.rdma.dra.dev", 1)}}}},
	{name: "gpu-hca-pair", claim: &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{request("gpu", "gpu", 1), request("hca", "ib.rdma.dra.dev", 1)},
		Constraints: []resourceapi.DeviceConstraint{{Requests: []string{"gpu", "hca"},
			MatchAttribute: ptr(resourceapi.FullyQualifiedName("resource.kubernetes.io/pcieRoot"))}}}}},
	// Diagnostic: the pair's two requests without the constraint, and two
	// baseline devices, to tell the constraint's cost from the second request's.
	{name: "gpu-hca-unaligned", claim: &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{request("gpu", "gpu", 1), request("hca", "ib.rdma.dra.dev", 1)}}}},
	{name: "two-baseline", claim: &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{request("a", "baseline", 1), request("b", "baseline", 1)}}}},
	// Diagnostic: one of our devices by a class that only compares the
	// driver (as the baseline's does), to tell the selector's attribute
	// lookups from the devices' size.
	{name: "hca-driver-only", claim: &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{request("hca", "rdma-driver-only", 1)}}}},
	{name: "eight-hcas", claim: &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{request("hcas", "ib.rdma.dra.dev", 8)}}}},
	{name: "rdma-hca-extended", extended: true},
}

func ptr[T any](v T) *T { return &v }

// envInts reads a comma-separated list of integers from the environment.
func envInts(tb testing.TB, name string, def []int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			tb.Fatalf("%s=%q: want positive integers separated by commas", name, v)
		}
		out = append(out, n)
	}
	return out
}

// BenchmarkScheduling: for each node count in SCALE_NODES (default 100),
// SCALE_PODS pods (default: one per node, at most 200) of each shape, created at once;
// reported per shape: pods/s, p50/p99 create-to-bind latency, and the ratio
// of each to the baseline shape's. Run with -benchtime=1x: one iteration is
// one whole run, and the figures are the run's.
func BenchmarkScheduling(b *testing.B) {
	for _, nodes := range envInts(b, "SCALE_NODES", []int{100}) {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			pods := min(nodes, 200) // eight-hcas takes a whole node per pod
			if p := envInts(b, "SCALE_PODS", nil); len(p) > 0 {
				pods = p[0]
			}
			for b.Loop() {
				runScale(b, nodes, pods)
			}
		})
	}
}

type result struct {
	shape            string
	podsPerSec       float64
	p50, p99         time.Duration
	heapAfterMB      float64
	schedulingWindow time.Duration
}

func runScale(b *testing.B, nodes, pods int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "scale")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cp, err := cluster.StartControlPlane(b, filepath.Join(dir, "cp"))
	if err != nil {
		b.Fatal(err)
	}
	defer cp.Stop()
	if err := cluster.StartScheduler(ctx, cp); err != nil {
		b.Fatal(err)
	}
	c := cp.Client
	root := cluster.RepoRoot()
	if _, err := cluster.ApplyFiles(ctx, cp.Config, false, filepath.Join(root, "deployments", "deviceclasses.yaml"),
		filepath.Join(root, "deployments", "deviceclass-legacy.yaml")); err != nil {
		b.Fatal(err)
	}
	for name, driver := range map[string]string{"gpu": gpuDriver, "baseline": baselineDriver, "rdma-driver-only": "rdma.dra.dev"} {
		class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", driver)}}}}}
		if _, err := c.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}

	inv := simulatedInventory(b, filepath.Join(dir, "node"))
	start := time.Now()
	sliceCount, devices := publishNodes(ctx, b, c, nodes, inv)
	b.Logf("N=%d: %d nodes, %d ResourceSlices, %d devices (%d HCAs) published in %v; all accepted by the API server",
		nodes, nodes, sliceCount, devices, nodes*len(inv.HCAs), time.Since(start).Round(time.Millisecond))
	heapBase := heapMB()
	b.ReportMetric(heapBase, "heap-MB-after-publish")

	var results []result
	only := os.Getenv("SCALE_SHAPES") // e.g. "baseline,one-hca" for a profile; the first is the baseline
	for _, s := range shapes {
		if only != "" && !slices.Contains(strings.Split(only, ","), s.name) {
			continue
		}
		r := runShape(ctx, b, c, s, pods)
		r.heapAfterMB = heapMB()
		results = append(results, r)
		cleanup(ctx, b, c)
	}
	report(b, nodes, pods, heapBase, results)
}

// simulatedInventory discovers the dgx-h100 preset once; every node
// publishes it under its own pool.
func simulatedInventory(tb testing.TB, dir string) hca.Inventory {
	spec, err := hcatest.Preset("dgx-h100")
	if err != nil {
		tb.Fatal(err)
	}
	node, err := hcatest.Build(dir, spec)
	if err != nil {
		tb.Fatal(err)
	}
	inv, err := hca.Discover(hca.WithSysfsRoot(node.SysfsRoot), hca.WithDevRoot(node.DevRoot))
	if err != nil {
		tb.Fatal(err)
	}
	return inv
}

// publishNodes creates N Ready nodes and their slices: ours as the daemon
// renders them (exclusive HCAs plus the legacy device for rdma/hca), the
// GPU driver's and the baseline driver's.
func publishNodes(ctx context.Context, tb testing.TB, c kubernetes.Interface, n int, inv hca.Inventory) (int, int) {
	var mu sync.Mutex
	var errs []error
	slicesMade, devices := 0, 0
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				s, d, err := publishNode(ctx, c, fmt.Sprintf("node-%04d", i), inv)
				mu.Lock()
				slicesMade, devices = slicesMade+s, devices+d
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		tb.Fatalf("%d of %d nodes failed; first: %v", len(errs), n, errs[0])
	}
	return slicesMade, devices
}

func publishNode(ctx context.Context, c kubernetes.Interface, name string, inv hca.Inventory) (int, int, error) {
	rl := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("224"), corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods: resource.MustParse("110")}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}
	node, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return 0, 0, err
	}
	node.Status.Capacity, node.Status.Allocatable = rl, rl
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if node, err = c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return 0, 0, err
	}
	if len(node.Spec.Taints) > 0 {
		node.Spec.Taints = nil
		if _, err := c.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			return 0, 0, err
		}
	}
	var all []resourceapi.ResourceSlice
	all = append(all, rslices.ResourceSlices(name, inv, rslices.Options{LegacyShares: 1000})...)
	all = append(all, otherSlice(name, gpuDriver, 8, func(i int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"resource.kubernetes.io/pcieRoot": {StringValue: ptr(pcieRoots[i/2])},
			gpuDriver + "/model":              {StringValue: ptr("H100-SXM5-80GB")},
			gpuDriver + "/index":              {IntValue: ptr(int64(i))},
			"resource.kubernetes.io/pciBusID": {StringValue: ptr(fmt.Sprintf("0000:%02x:00.0", 0x18+i))},
		}
	}))
	all = append(all, otherSlice(name, baselineDriver, 10, func(i int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{baselineDriver + "/index": {IntValue: ptr(int64(i))}}
	}))
	devices := 0
	for i := range all {
		s := all[i]
		s.Name = fmt.Sprintf("%s-%s-%d", name, strings.ReplaceAll(s.Spec.Driver, ".", "-"), i)
		devices += len(s.Spec.Devices)
		if _, err := c.ResourceV1().ResourceSlices().Create(ctx, &s, metav1.CreateOptions{}); err != nil {
			return 0, 0, fmt.Errorf("node %s: slice %s (%d devices): %w", name, s.Name, len(s.Spec.Devices), err)
		}
	}
	return len(all), devices, nil
}

func otherSlice(node, driver string, n int, attrs func(int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) resourceapi.ResourceSlice {
	s := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: &node,
		Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}}}
	for i := range n {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("dev-%d", i), Attributes: attrs(i)})
	}
	return s
}

// runShape creates pods of one shape at once and waits until all are
// bound, timing each from its create call to the watch event with its node.
func runShape(ctx context.Context, tb testing.TB, c kubernetes.Interface, s shape, n int) result {
	w, err := c.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{FieldSelector: fields.Everything().String()})
	if err != nil {
		tb.Fatal(err)
	}
	defer w.Stop()

	created := make([]time.Time, n)
	var mu sync.Mutex
	bound := map[string]time.Time{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.Spec.NodeName == "" {
				continue
			}
			mu.Lock()
			if _, seen := bound[p.Name]; !seen {
				bound[p.Name] = time.Now()
			}
			full := len(bound) == n
			mu.Unlock()
			if full {
				return
			}
		}
	}()

	first := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			name := fmt.Sprintf("%s-%d", s.name, i)
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
			if s.extended {
				one := corev1.ResourceList{"rdma/hca": resource.MustParse("1")}
				pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: one, Limits: one}
			} else {
				claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: *s.claim}
				if _, err := c.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
				pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimName: &name}}
				pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "rdma"}}
			}
			t := time.Now()
			if _, err := c.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				errs <- err
				return
			}
			mu.Lock()
			created[i] = t
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatalf("shape %s: %v", s.name, err)
	}

	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		mu.Lock()
		got := len(bound)
		mu.Unlock()
		tb.Fatalf("shape %s: %d of %d pods bound after 10 minutes", s.name, got, n)
	}
	mu.Lock()
	defer mu.Unlock()
	lat := make([]time.Duration, 0, n)
	last := first
	for i := range n {
		t := bound[fmt.Sprintf("%s-%d", s.name, i)]
		lat = append(lat, t.Sub(created[i]))
		if t.After(last) {
			last = t
		}
	}
	slices.Sort(lat)
	window := last.Sub(first)
	return result{shape: s.name, podsPerSec: float64(n) / window.Seconds(), p50: lat[n/2], p99: lat[(n*99)/100], schedulingWindow: window}
}

// cleanup deletes the shape's pods and claims and waits until they are
// gone, so the next shape starts on free devices.
func cleanup(ctx context.Context, tb testing.TB, c kubernetes.Interface) {
	zero := int64(0)
	if err := c.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		tb.Fatal(err)
	}
	if err := c.ResourceV1().ResourceClaims(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		tb.Fatal(err)
	}
	// Without the resourceclaim controller (left out: its node lifecycle
	// companions would need a lease per node), the scheduler's
	// delete-protection finalizer stays; the benchmark drops it.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if claims, err := c.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{}); err == nil {
			for i := range claims.Items {
				cl := &claims.Items[i]
				if len(cl.Finalizers) > 0 {
					cl.Finalizers = nil
					_, _ = c.ResourceV1().ResourceClaims(namespace).Update(ctx, cl, metav1.UpdateOptions{})
				}
			}
		}
		pods, err1 := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		claims, err2 := c.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err1 == nil && err2 == nil && len(pods.Items) == 0 && len(claims.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("cleanup: pods and claims still there after 2 minutes (%v, %v)", err1, err2)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// heapMB is the process's live heap after a GC: etcd, the API server, the
// scheduler and this test's clients share the process.
func heapMB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

func report(b *testing.B, nodes, pods int, heapBase float64, results []result) {
	base := results[0]
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nN=%d nodes (%d HCAs), %d pods per shape; heap after publish %.0f MB\n", nodes, nodes*10, pods, heapBase)
	fmt.Fprintf(&sb, "%-18s %9s %9s %9s %12s %12s %9s\n", "shape", "pods/s", "p50", "p99", "x base p50", "x base pod", "heap MB")
	for _, r := range results {
		perPod := (1 / r.podsPerSec) / (1 / base.podsPerSec)
		fmt.Fprintf(&sb, "%-18s %9.1f %9v %9v %12.2f %12.2f %9.0f\n", r.shape, r.podsPerSec, r.p50.Round(time.Millisecond),
			r.p99.Round(time.Millisecond), float64(r.p50)/float64(base.p50), perPod, r.heapAfterMB)
		b.ReportMetric(r.podsPerSec, r.shape+"-pods/s")
		b.ReportMetric(float64(r.p50.Milliseconds()), r.shape+"-p50-ms")
		b.ReportMetric(float64(r.p99.Milliseconds()), r.shape+"-p99-ms")
		b.ReportMetric(perPod, r.shape+"-x-baseline")
	}
	fmt.Print(sb.String())
}
