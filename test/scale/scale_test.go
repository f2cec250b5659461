// Package scale measures how the real kube-scheduler copes with many
// richly attributed RDMA nodes: the ResourceSlices of N simulated nodes
// (8 ConnectX-7 + 2 BlueField-3 each, rendered by pkg/devices from a real
// discovery of the simulated dgx-h100 node), beside the anchor, an NVIDIA
// GPU DRA driver's slices (8 GPUs per node with that driver's attribute set,
// on the same PCIe roots), a baseline driver's devices with one attribute
// and a sweep of synthetic drivers whose devices have 1 to 32 (each one
// published for its own shape only). It is a benchmark, run by
// `make bench-scale`; it asserts only what makes its figures meaningful
// (every pod bound, every slice accepted by the API server).
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

	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

const (
	baselineDriver = "baseline.example.com"
	namespace      = "default"
)

// gpuDriver is the NVIDIA GPU DRA driver's name; its devices here carry
// that driver's attributes (nvidiaGPU) and its class is that driver's.
// The allocator tries a node's pools sorted by driver name and evaluates
// every device it passes, so a claim for rdma.dra.dev devices first
// checks (and rejects) every gpu.nvidia.com device on the node, while a GPU
// claim never checks ours. swappedGPUDriver is the same GPU under a name
// that sorts after ours: the anchors run under both names in one run, so
// the report tells the devices' own cost from the names' order.
const (
	gpuDriver        = "gpu.nvidia.com"
	swappedGPUDriver = "vgpu.nvidia.example"
)

// swappedSuffix names the anchor shapes run with swappedGPUDriver.
const swappedSuffix = "-swapped"

// sweep are the attribute counts of the synthetic drivers' devices.
var sweep = []int{1, 8, 16, 24, 32}

func sweepDriver(n int) string { return fmt.Sprintf("attrs-%d.example.com", n) }

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

// gpuPCIeRoot is the constraint of the aligned pairs.
var gpuPCIeRoot = []resourceapi.DeviceConstraint{{Requests: []string{"a", "b"},
	MatchAttribute: ptr(resourceapi.FullyQualifiedName("resource.kubernetes.io/pcieRoot"))}}

func claimOf(constraints []resourceapi.DeviceConstraint, requests ...resourceapi.DeviceRequest) *resourceapi.ResourceClaimSpec {
	return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests, Constraints: constraints}}
}

// anchors are the shapes of the anchor ratios, each ours beside the GPU
// one it is measured against, with the GPU published as gpu.
func anchors(gpu string) []shape {
	suffix := ""
	if gpu != gpuDriver {
		suffix = swappedSuffix
	}
	return []shape{
		{name: "gpu" + suffix, claim: claimOf(nil, request("a", gpu, 1))},
		{name: "one-hca" + suffix, claim: claimOf(nil, request("a", "hca.rdma.dra.dev", 1))},
		{name: "gpu-pair" + suffix, claim: claimOf(gpuPCIeRoot, request("a", gpu, 1), request("b", gpu, 1))},
		{name: "gpu-hca-pair" + suffix, claim: claimOf(gpuPCIeRoot, request("a", gpu, 1), request("b", "ib.rdma.dra.dev", 1))},
	}
}

func reversed(ss []shape) []shape {
	out := slices.Clone(ss)
	slices.Reverse(out)
	return out
}

var shapes = []shape{
	{name: "baseline", claim: claimOf(nil, request("dev", "baseline", 1))},
	// Diagnostic: the pair's two requests without the constraint, and two
	// baseline devices, to tell the constraint's cost from the second request's.
	{name: "gpu-hca-unaligned", claim: claimOf(nil, request("a", gpuDriver, 1), request("b", "ib.rdma.dra.dev", 1))},
	{name: "two-baseline", claim: claimOf(nil, request("a", "baseline", 1), request("b", "baseline", 1))},
	// Diagnostic: one of our devices by a class that only compares the
	// driver (as the baseline's does), to tell the selector's attribute
	// lookups from the devices' size.
	{name: "hca-driver-only", claim: claimOf(nil, request("hca", "rdma-driver-only", 1))},
	{name: "eight-hcas", claim: claimOf(nil, request("hcas", "ib.rdma.dra.dev", 8))},
	{name: "rdma-hca-extended", extended: true},
}

// sweepShape claims one device of the synthetic driver whose devices have
// n attributes, by a class that compares only the driver, as the
// baseline's.
func sweepShape(n int) shape {
	return shape{name: fmt.Sprintf("attrs-%d", n), claim: claimOf(nil, request("dev", fmt.Sprintf("attrs-%d", n), 1))}
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
// of each to the baseline shape's; then the per-attribute line of the sweep
// and the anchor ratios (our shapes' cost per pod over the GPU ones'), with
// the GPU driver's name swapped, both orders pooled, and last the real names.
// Run with -benchtime=1x: one iteration is one whole run, and the figures
// are the run's.
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
	rounds           int
	podsPerSec       float64
	p50, p99         time.Duration
	latencies        []time.Duration // sorted
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
	classes := map[string]string{
		"baseline":         fmt.Sprintf("device.driver == %q", baselineDriver),
		"rdma-driver-only": `device.driver == "rdma.dra.dev"`,
	}
	for _, gpu := range []string{gpuDriver, swappedGPUDriver} {
		// The NVIDIA GPU DRA driver's own class (its chart's deviceclass-gpu.yaml).
		classes[gpu] = fmt.Sprintf("device.driver == '%s' && device.attributes['%s'].type == 'gpu'", gpu, gpu)
	}
	for _, n := range sweep {
		classes[fmt.Sprintf("attrs-%d", n)] = fmt.Sprintf("device.driver == %q", sweepDriver(n))
	}
	for name, expr := range classes {
		class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}}}
		if _, err := c.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}

	inv := simulatedInventory(b, filepath.Join(dir, "node"))
	start := time.Now()
	sliceCount, devs := publishNodes(ctx, b, c, nodes, inv)
	b.Logf("N=%d: %d nodes, %d ResourceSlices, %d devices (%d HCAs) published in %v; all accepted by the API server",
		nodes, nodes, sliceCount, devs, nodes*len(inv.HCAs), time.Since(start).Round(time.Millisecond))
	heapBase := heapMB()
	b.ReportMetric(heapBase, "heap-MB-after-publish")

	var results []result
	only := os.Getenv("SCALE_SHAPES") // e.g. "baseline,one-hca" for a profile; the first is the baseline
	wanted := func(name string) bool { return only == "" || slices.Contains(strings.Split(only, ","), name) }
	run := func(ss []shape) {
		for _, s := range ss {
			if !wanted(s.name) {
				continue
			}
			r := runShape(ctx, b, c, s, pods)
			r.heapAfterMB = heapMB()
			results = append(results, r)
			cleanup(ctx, b, c)
		}
	}
	// The anchors run in order, then with the GPU renamed in order and
	// reversed, then renamed back and reversed: a drift of the machine's
	// speed during the run cancels out of both orders' ratios.
	run(shapes[:1])
	run(anchors(gpuDriver))
	if slices.ContainsFunc(anchors(swappedGPUDriver), func(s shape) bool { return wanted(s.name) }) {
		renameGPU(ctx, b, c, nodes, gpuDriver, swappedGPUDriver)
		run(anchors(swappedGPUDriver))
		run(reversed(anchors(swappedGPUDriver)))
		renameGPU(ctx, b, c, nodes, swappedGPUDriver, gpuDriver)
	}
	run(reversed(anchors(gpuDriver)))
	run(shapes[1:])
	// The sweep: one synthetic driver at a time beside the others. The
	// allocator tries a node's pools in driver-name order until one has a
	// match, so a pool published for the whole run would add its cost to
	// every shape of a driver sorting after it, and the sweep's drivers to
	// each other's.
	for _, n := range sweep {
		s := sweepShape(n)
		if !wanted(s.name) {
			continue
		}
		start := time.Now()
		publishDriver(ctx, b, c, nodes, func(node string) resourceapi.ResourceSlice {
			return otherSlice(node, sweepDriver(n), 10, func(i int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
				return syntheticAttributes(sweepDriver(n), n, i)
			})
		})
		b.Logf("%s: %d slices of %d devices with %d attributes published in %v", sweepDriver(n), nodes, 10, n, time.Since(start).Round(time.Millisecond))
		r := runShape(ctx, b, c, s, pods)
		r.heapAfterMB = heapMB()
		results = append(results, r)
		cleanup(ctx, b, c)
		deleteDriver(ctx, b, c, sweepDriver(n))
	}
	report(b, nodes, pods, heapBase, merge(results))
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
	slicesMade, devs := 0, 0
	publishEach(ctx, tb, n, func(node string) error {
		s, d, err := publishNode(ctx, c, node, inv)
		mu.Lock()
		slicesMade, devs = slicesMade+s, devs+d
		mu.Unlock()
		return err
	})
	return slicesMade, devs
}

// nodeName is the i-th node's name.
func nodeName(i int) string { return fmt.Sprintf("node-%04d", i) }

// publishEach runs f for each of n nodes on 16 workers and fails the
// benchmark if any failed.
func publishEach(ctx context.Context, tb testing.TB, n int, f func(node string) error) {
	var mu sync.Mutex
	var errs []error
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := f(nodeName(i)); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		select {
		case work <- i:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		tb.Fatalf("%d of %d nodes failed; first: %v", len(errs), n, errs[0])
	}
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
	all = append(all, devices.ResourceSlices(name, inv, devices.Options{LegacyShares: 1000})...)
	all = append(all, gpuSlice(name, gpuDriver))
	all = append(all, otherSlice(name, baselineDriver, 10, func(i int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{baselineDriver + "/index": {IntValue: ptr(int64(i))}}
	}))
	devs := 0
	for i := range all {
		s := all[i]
		s.Name = fmt.Sprintf("%s-%s-%d", name, strings.ReplaceAll(s.Spec.Driver, ".", "-"), i)
		devs += len(s.Spec.Devices)
		if _, err := c.ResourceV1().ResourceSlices().Create(ctx, &s, metav1.CreateOptions{}); err != nil {
			return 0, 0, fmt.Errorf("node %s: slice %s (%d devices): %w", name, s.Name, len(s.Spec.Devices), err)
		}
	}
	return len(all), devs, nil
}

// nvidiaGPU is the i-th H100 of a DGX H100 as the NVIDIA GPU DRA driver
// (github.com/NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin,
// GpuInfo.Attributes and fullGpuCapacity, May 2026) publishes it: eight
// attributes in its domain, the standard pciBusID and pcieRoot,
// addressingMode where the platform supports one, and a memory capacity.
// Two GPUs sit behind each PCIe root of the IB HCAs.
func nvidiaGPU(driver string, i int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	str := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr(v)} }
	ver := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: ptr(v)} }
	d := func(id string) resourceapi.QualifiedName { return resourceapi.QualifiedName(driver + "/" + id) }
	return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		d("type"):                         str("gpu"),
		d("uuid"):                         str(fmt.Sprintf("GPU-4d3e5a2c-9f1b-4c7e-8a6d-%012x", i)),
		d("productName"):                  str("NVIDIA H100 80GB HBM3"),
		d("brand"):                        str("Nvidia"),
		d("architecture"):                 str("Hopper"),
		d("cudaComputeCapability"):        ver("9.0.0"),
		d("driverVersion"):                ver("580.95.5"),
		d("cudaDriverVersion"):            ver("13.0.0"),
		d("addressingMode"):               str("HMM"),
		"resource.kubernetes.io/pciBusID": str(fmt.Sprintf("0000:%02x:00.0", 0x18+i)),
		"resource.kubernetes.io/pcieRoot": str(pcieRoots[i/2]),
	}
}

// syntheticAttributes are n attributes of the i-th device of a sweep
// driver: index, then string, int, bool and version values in turn.
func syntheticAttributes(driver string, n, i int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		resourceapi.QualifiedName(driver + "/index"): {IntValue: ptr(int64(i))}}
	for k := 1; k < n; k++ {
		name := resourceapi.QualifiedName(fmt.Sprintf("%s/a%02d", driver, k))
		switch k % 4 {
		case 0:
			attrs[name] = resourceapi.DeviceAttribute{StringValue: ptr(fmt.Sprintf("value-%d-%d", k, i))}
		case 1:
			attrs[name] = resourceapi.DeviceAttribute{IntValue: ptr(int64(k*100 + i))}
		case 2:
			attrs[name] = resourceapi.DeviceAttribute{BoolValue: ptr(k%3 == 0)}
		case 3:
			attrs[name] = resourceapi.DeviceAttribute{VersionValue: ptr(fmt.Sprintf("%d.%d.0", k, i))}
		}
	}
	return attrs
}

func otherSlice(node, driver string, n int, attrs func(int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) resourceapi.ResourceSlice {
	s := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: &node,
		Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}}}
	for i := range n {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("dev-%d", i), Attributes: attrs(i)})
	}
	return s
}

// gpuSlice is a node's eight H100s, published by the GPU driver named
// driver, each with its 80 GB memory capacity.
func gpuSlice(node, driver string) resourceapi.ResourceSlice {
	s := otherSlice(node, driver, 8, func(i int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute { return nvidiaGPU(driver, i) })
	for i := range s.Spec.Devices {
		s.Spec.Devices[i].Name = fmt.Sprintf("gpu-%d", i)
		s.Spec.Devices[i].Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: resource.MustParse("81559Mi")}}
	}
	return s
}

// publishDriver creates one slice per node, slice(node), each named after
// its node and driver.
func publishDriver(ctx context.Context, tb testing.TB, c kubernetes.Interface, nodes int, slice func(node string) resourceapi.ResourceSlice) {
	publishEach(ctx, tb, nodes, func(node string) error {
		s := slice(node)
		s.Name = fmt.Sprintf("%s-%s", node, strings.ReplaceAll(s.Spec.Driver, ".", "-"))
		_, err := c.ResourceV1().ResourceSlices().Create(ctx, &s, metav1.CreateOptions{})
		return err
	})
}

// deleteDriver deletes every slice of driver.
func deleteDriver(ctx context.Context, tb testing.TB, c kubernetes.Interface, driver string) {
	if err := c.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{FieldSelector: "spec.driver=" + driver}); err != nil {
		tb.Fatal(err)
	}
}

// renameGPU republishes every node's GPUs under the driver name to instead
// of from, and waits until the API server lists them all.
func renameGPU(ctx context.Context, tb testing.TB, c kubernetes.Interface, nodes int, from, to string) {
	start := time.Now()
	deleteDriver(ctx, tb, c, from)
	publishDriver(ctx, tb, c, nodes, func(node string) resourceapi.ResourceSlice { return gpuSlice(node, to) })
	err := poll.Until(ctx, "the GPU slices renamed", 100*time.Millisecond, 10*time.Minute, func(ctx context.Context) (bool, string, error) {
		old, err1 := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + from})
		now, err2 := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + to})
		if err1 != nil || err2 != nil {
			return false, "", fmt.Errorf("listing GPU slices: %v, %v", err1, err2)
		}
		return len(old.Items) == 0 && len(now.Items) == nodes, fmt.Sprintf("%d slices of %s, %d of %s", len(old.Items), from, len(now.Items), to), nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("GPUs of %d nodes republished as %s (were %s) in %v", nodes, to, from, time.Since(start).Round(time.Millisecond))
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
	return result{shape: s.name, rounds: 1, podsPerSec: float64(n) / window.Seconds(), p50: lat[n/2], p99: lat[(n*99)/100],
		latencies: lat, schedulingWindow: window}
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
	err := poll.Until(ctx, "the shape's pods and claims to be gone", 200*time.Millisecond, 2*time.Minute, func(ctx context.Context) (bool, string, error) {
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
		if err1 != nil || err2 != nil {
			return false, fmt.Sprintf("%v, %v", err1, err2), nil
		}
		return len(pods.Items) == 0 && len(claims.Items) == 0, fmt.Sprintf("%d pods, %d claims", len(pods.Items), len(claims.Items)), nil
	})
	if err != nil {
		tb.Fatalf("cleanup: %v", err)
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

// merge pools the rounds of a shape that ran more than once: pods over the
// sum of the windows, latencies of every pod.
func merge(results []result) []result {
	var out []result
	index := map[string]int{}
	for _, r := range results {
		i, seen := index[r.shape]
		if !seen {
			index[r.shape] = len(out)
			out = append(out, r)
			continue
		}
		m := &out[i]
		pods := m.podsPerSec*m.schedulingWindow.Seconds() + r.podsPerSec*r.schedulingWindow.Seconds()
		m.schedulingWindow += r.schedulingWindow
		m.podsPerSec = pods / m.schedulingWindow.Seconds()
		m.latencies = append(m.latencies, r.latencies...)
		slices.Sort(m.latencies)
		m.p50, m.p99 = m.latencies[len(m.latencies)/2], m.latencies[len(m.latencies)*99/100]
		m.heapAfterMB = max(m.heapAfterMB, r.heapAfterMB)
		m.rounds++
	}
	return out
}

// perPod is a shape's scheduling cost per pod: its window over its pods.
func (r result) perPod() time.Duration { return time.Duration(float64(time.Second) / r.podsPerSec) }

func report(b *testing.B, nodes, pods int, heapBase float64, results []result) {
	base := results[0]
	byShape := map[string]result{}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nN=%d nodes (%d HCAs), %d pods per shape and round; heap after publish %.0f MB\n", nodes, nodes*10, pods, heapBase)
	fmt.Fprintf(&sb, "%-20s %6s %9s %9s %9s %9s %12s %12s %9s\n", "shape", "rounds", "pods/s", "ms/pod", "p50", "p99", "x base p50", "x base pod", "heap MB")
	for _, r := range results {
		byShape[r.shape] = r
		perPod := float64(r.perPod()) / float64(base.perPod())
		fmt.Fprintf(&sb, "%-20s %6d %9.1f %9.1f %9v %9v %12.2f %12.2f %9.0f\n", r.shape, r.rounds, r.podsPerSec, ms(r.perPod()),
			r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), float64(r.p50)/float64(base.p50), perPod, r.heapAfterMB)
		b.ReportMetric(r.podsPerSec, r.shape+"-pods/s")
		b.ReportMetric(float64(r.p50.Milliseconds()), r.shape+"-p50-ms")
		b.ReportMetric(float64(r.p99.Milliseconds()), r.shape+"-p99-ms")
		b.ReportMetric(perPod, r.shape+"-x-baseline")
	}
	// The per-attribute line: a least-squares fit of the cost per pod over
	// the attribute count.
	var xs, ys []float64
	for _, n := range sweep {
		if r, ok := byShape[fmt.Sprintf("attrs-%d", n)]; ok {
			xs, ys = append(xs, float64(n)), append(ys, ms(r.perPod()))
		}
	}
	if len(xs) >= 2 {
		fmt.Fprintf(&sb, "per-attribute sweep (one device, class comparing only the driver):")
		for i := range xs {
			fmt.Fprintf(&sb, " %g:%.1fms", xs[i], ys[i])
		}
		a, slope, r2 := fit(xs, ys)
		fmt.Fprintf(&sb, "\nper-attribute cost: %.3f ms per pod per attribute (%.1f ms at 0 attributes, R²=%.2f)\n", slope, a, r2)
		b.ReportMetric(slope, "ms-per-pod-per-attribute")
	}
	// The anchor ratios: our shape's cost per pod over the GPU shape's,
	// with the drivers' real names (the GPU's pool tried before ours), with
	// the GPU's renamed to sort after ours, and both orders pooled (the
	// sums of the two orders' costs: the devices' own cost, whichever
	// name sorts first). The last line keeps the real names.
	ratio := func(suffixes []string, ours, theirs string) (float64, bool) {
		var num, den time.Duration
		for _, suffix := range suffixes {
			o, ok1 := byShape[ours+suffix]
			t, ok2 := byShape[theirs+suffix]
			if !ok1 || !ok2 {
				return 0, false
			}
			num, den = num+o.perPod(), den+t.perPod()
		}
		return float64(num) / float64(den), true
	}
	orders := []struct {
		label, metric string
		suffixes      []string
	}{
		{fmt.Sprintf("GPU as %s, swapped (%s < %s, our pool tried first)", swappedGPUDriver, "rdma.dra.dev", swappedGPUDriver), "swapped", []string{swappedSuffix}},
		{"both orders pooled (each driver's pool first in one, second in the other)", "pooled", []string{"", swappedSuffix}},
		{fmt.Sprintf("GPU as %s (%s < rdma.dra.dev, the GPU's pool tried first)", gpuDriver, gpuDriver), "", []string{""}},
	}
	for _, o := range orders {
		x, ok1 := ratio(o.suffixes, "one-hca", "gpu")
		y, ok2 := ratio(o.suffixes, "gpu-hca-pair", "gpu-pair")
		if !ok1 || !ok2 {
			continue
		}
		metric := func(name string) string { return strings.TrimPrefix(o.metric+"-"+name, "-") }
		b.ReportMetric(x, metric("one-hca/gpu"))
		b.ReportMetric(y, metric("pair/gpu-pair"))
		fmt.Fprintf(&sb, "%s: one-hca/gpu=%.2f pair/gpu-pair=%.2f\n", o.label, x, y)
		if o.metric == "" {
			fmt.Fprintf(&sb, "anchor ratios: one-hca/gpu=%.2f pair/gpu-pair=%.2f\n", x, y)
		}
	}
	fmt.Print(sb.String())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fit is the least-squares line y = a + b·x and its R².
func fit(xs, ys []float64) (a, b, r2 float64) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	b = (n*sxy - sx*sy) / (n*sxx - sx*sx)
	a = (sy - b*sx) / n
	var ssRes, ssTot float64
	for i := range xs {
		ssRes += (ys[i] - a - b*xs[i]) * (ys[i] - a - b*xs[i])
		ssTot += (ys[i] - sy/n) * (ys[i] - sy/n)
	}
	if ssTot > 0 {
		r2 = 1 - ssRes/ssTot
	}
	return a, b, r2
}
