package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/clock"

	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// The standard attributes the claims match on.
const (
	matchPCIeRoot = resourceapi.FullyQualifiedName(deviceattribute.StandardDeviceAttributePCIeRoot)
	matchNUMANode = resourceapi.FullyQualifiedName(deviceattribute.StandardDeviceAttributeNUMANode)
)

// gpuDriverName is the NVIDIA GPU DRA driver's name, and its DeviceClass's.
const gpuDriverName = "gpu.nvidia.com"

// tray is one simulated node of TestGPUPairsByTopology: the attribute its
// claim pairs on (docs/gpu-alignment.md) and, written out by hand from the
// preset's layout rather than from discovery, the GPUs each HCA's
// topology pairs it with.
type tray struct {
	preset  string
	match   resourceapi.FullyQualifiedName
	product string
	arch    string
	cc      string
	pairs   map[string][]string // HCA device => its complex's GPU bus IDs
}

var trays = []tray{{
	// Each root complex: two CX-7 and two H100 (rdma_topo has no complex
	// for it; the root complex is the pairing NCCL calls PHB).
	preset: "dgx-h100", match: matchPCIeRoot,
	product: "NVIDIA H100 80GB HBM3", arch: "Hopper", cc: "9.0.0",
	pairs: map[string][]string{
		"mlx5-0": {"0000:18:00.0", "0000:19:00.0"}, "mlx5-1": {"0000:18:00.0", "0000:19:00.0"},
		"mlx5-2": {"0000:41:00.0", "0000:42:00.0"}, "mlx5-3": {"0000:41:00.0", "0000:42:00.0"},
		"mlx5-4": {"0000:9d:00.0", "0000:9e:00.0"}, "mlx5-5": {"0000:9d:00.0", "0000:9e:00.0"},
		"mlx5-6": {"0000:c3:00.0", "0000:c4:00.0"}, "mlx5-7": {"0000:c3:00.0", "0000:c4:00.0"},
	},
}, {
	// rdma_topo's NUMA-based complexes: a socket's CX-7s and B200s.
	preset: "gb200", match: matchNUMANode,
	product: "NVIDIA GB200", arch: "Blackwell", cc: "10.0.0",
	pairs: map[string][]string{
		"mlx5-0": {"0008:01:00.0", "0009:01:00.0"}, "mlx5-1": {"0008:01:00.0", "0009:01:00.0"},
		"mlx5-2": {"0018:01:00.0", "0019:01:00.0"}, "mlx5-3": {"0018:01:00.0", "0019:01:00.0"},
	},
}, {
	// rdma_topo's DMA-based complexes: one GPU beside each card's Data
	// Direct function (the PF's own root holds no GPU).
	preset: "gb300", match: matchPCIeRoot,
	product: "NVIDIA GB300", arch: "Blackwell", cc: "10.3.0",
	pairs: map[string][]string{
		"mlx5-0": {"0008:06:00.0"}, "mlx5-1": {"0009:06:00.0"},
		"mlx5-2": {"0018:06:00.0"}, "mlx5-3": {"0019:06:00.0"},
	},
}}

// TestGPUPairsByTopology: on simulated dgx-h100, gb200 and gb300 nodes our
// slices (what the daemon publishes for the tree) sit beside the GPU
// slices NVIDIA's GPU DRA driver publishes for the same tree; one claim per
// GPU asks for a GPU and an InfiniBand HCA matched on the tray's attribute,
// and the real scheduler's allocator picks. Every pair must be one the
// topology dictates. A gb300-acs-bad node shows the GPUDirect taint at
// work: a claim that does not tolerate it gets no HCA there, one that does
// gets one.
func TestGPUPairsByTopology(t *testing.T) {
	t.Parallel() // no node: see parallel in main_test.go
	ctx := t.Context()
	cp, err := cluster.StartControlPlane(t, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	for _, start := range []func(context.Context, *cluster.ControlPlane) error{cluster.StartControllers, cluster.StartScheduler} {
		if err := start(ctx, cp); err != nil {
			t.Fatal(err)
		}
	}
	c := cp.Client
	if _, err := cluster.ApplyFiles(ctx, cp.Config, false, filepath.Join(cluster.RepoRoot(), "deployments", "deviceclasses.yaml")); err != nil {
		t.Fatal(err)
	}
	// The NVIDIA GPU DRA driver's own class (its chart's deviceclass-gpu.yaml).
	mustCreate(t)(c.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: gpuDriverName},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == '%s' && device.attributes['%s'].type == 'gpu'", gpuDriverName, gpuDriverName)}}}},
	}, metav1.CreateOptions{}))
	const ns = "pairs"
	mustCreate(t)(c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))

	gpuBus := map[string]string{} // "<node>/<gpu device>" => bus ID
	for _, tr := range append(slices.Clone(trays), tray{preset: "gb300-acs-bad", product: "NVIDIA GB300", arch: "Blackwell", cc: "10.3.0"}) {
		publishTray(ctx, t, c, tr, gpuBus)
	}

	type pod struct{ tray, name string }
	var pods []pod
	for _, tr := range trays {
		for i := range len(tr.pairs) {
			name := fmt.Sprintf("%s-%d", tr.preset, i)
			createPairPod(ctx, t, c, ns, tr.preset, name, tr.match, false)
			pods = append(pods, pod{tr.preset, name})
		}
	}
	for _, p := range pods {
		waitAllocated(ctx, t, c, ns, p.name)
	}
	for _, tr := range trays {
		right, n := 0, 0
		for _, p := range pods {
			if p.tray != tr.preset {
				continue
			}
			n++
			gpu, hcaDev := allocated(ctx, t, c, ns, p.name)
			bus := gpuBus[tr.preset+"/"+gpu]
			if slices.Contains(tr.pairs[hcaDev], bus) {
				right++
			} else {
				t.Errorf("%s: claim %s paired GPU %s (%s) with %s, whose complex holds %v", tr.preset, p.name, gpu, bus, hcaDev, tr.pairs[hcaDev])
			}
		}
		t.Logf("topology pairs: %s %d/%d", tr.preset, right, n)
		fmt.Printf("topology pairs: %s %d/%d\n", tr.preset, right, n)
		if n != len(tr.pairs) {
			t.Errorf("%s: %d claims judged, want %d", tr.preset, n, len(tr.pairs))
		}
	}

	// gb300-acs-bad: every HCA carries the gpudirect-not-ready taint.
	createPairPod(ctx, t, c, ns, "gb300-acs-bad", "acs-bad-tolerates", matchPCIeRoot, true)
	waitAllocated(ctx, t, c, ns, "acs-bad-tolerates")
	createPairPod(ctx, t, c, ns, "gb300-acs-bad", "acs-bad-strict", matchPCIeRoot, false)
	waitUnschedulable(ctx, t, c, ns, "acs-bad-strict")
	gpu, hcaDev := allocated(ctx, t, c, ns, "acs-bad-tolerates")
	t.Logf("gb300-acs-bad: the tolerating claim got %s and %s (%s); the strict one is unschedulable", hcaDev, gpu, gpuBus["gb300-acs-bad/"+gpu])
}

func mustCreate(t *testing.T) func(any, error) {
	return func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// publishTray simulates the tray's node, registers it Ready, and publishes
// ours (devices.ResourceSlices, what the daemon publishes) and the GPUs.
func publishTray(ctx context.Context, t *testing.T, c kubernetes.Interface, tr tray, gpuBus map[string]string) {
	t.Helper()
	spec, err := hcatest.Preset(tr.preset)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := hcatest.Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := hca.Discover(hca.WithSysfsRoot(sim.SysfsRoot), hca.WithDevRoot(sim.DevRoot), hca.WithReadFile(sim.ReadFile))
	if err != nil {
		t.Fatal(err)
	}
	node := tr.preset
	registerReadyNode(ctx, t, c, node)
	for _, s := range devices.ResourceSlices(node, inv, devices.Options{}) {
		mustCreate(t)(c.ResourceV1().ResourceSlices().Create(ctx, &s, metav1.CreateOptions{}))
	}
	gpus := nvidiaGPUSlice(t, node, sim, tr)
	for _, d := range gpus.Spec.Devices {
		gpuBus[node+"/"+d.Name] = *d.Attributes[deviceattribute.StandardDeviceAttributePCIBusID].StringValue
	}
	mustCreate(t)(c.ResourceV1().ResourceSlices().Create(ctx, &gpus, metav1.CreateOptions{}))
}

// nvidiaGPUSlice is the node's GPUs as NVIDIA's GPU DRA driver publishes
// them (kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin,
// GpuInfo.Attributes at 0545e9e, 2026): eight attributes in its domain,
// addressingMode, the standard pciBusID, pcieRoot and numaNode (scalar)
// computed by k8s.io/dynamic-resource-allocation/deviceattribute from the
// node's sysfs as that driver computes them, and a memory capacity.
func nvidiaGPUSlice(t *testing.T, node string, sim *hcatest.Node, tr tray) resourceapi.ResourceSlice {
	t.Helper()
	s := resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu-nvidia-com"},
		Spec: resourceapi.ResourceSliceSpec{Driver: gpuDriverName, NodeName: &node,
			Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}},
	}
	str := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &v} }
	ver := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: &v} }
	fs := deviceattribute.WithFSFromRoot(sim.SysfsRoot)
	minor := 0
	for _, d := range sim.Spec.Devices {
		if d.Vendor != "10de" || !strings.HasPrefix(d.Class, "03") {
			continue
		}
		bus := d.BusID()
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":                  str("gpu"),
			"uuid":                  str(fmt.Sprintf("GPU-5e1c7a20-%s-4c7e-8a6d-%012x", strings.ReplaceAll(node, "-", "")[:4], minor)),
			"productName":           str(tr.product),
			"brand":                 str("Nvidia"),
			"architecture":          str(tr.arch),
			"cudaComputeCapability": ver(tr.cc),
			"driverVersion":         ver("580.95.5"),
			"cudaDriverVersion":     ver("13.0.0"),
			"addressingMode":        str("HMM"),
		}
		for _, a := range []func() (deviceattribute.DeviceAttribute, error){
			func() (deviceattribute.DeviceAttribute, error) { return deviceattribute.GetPCIBusIDAttribute(bus) },
			func() (deviceattribute.DeviceAttribute, error) {
				return deviceattribute.GetPCIeRootAttributeByPCIBusID(bus, fs)
			},
			func() (deviceattribute.DeviceAttribute, error) {
				return deviceattribute.GetNUMANodeAttributeByPCIBusID(bus, deviceattribute.ScalarAttribute, fs)
			},
		} {
			attr, err := a()
			if err != nil {
				t.Fatalf("GPU %s of %s: %v", bus, node, err)
			}
			attrs[attr.Name] = attr.Value
		}
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name:       fmt.Sprintf("gpu-%d", minor),
			Attributes: attrs,
			Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("183359Mi")}},
		})
		minor++
	}
	if len(s.Spec.Devices) == 0 {
		t.Fatalf("preset %s has no GPU", node)
	}
	return s
}

// registerReadyNode creates a Node as a kubelet would, Ready, with a lease
// so node lifecycle keeps it.
func registerReadyNode(ctx context.Context, t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	mustCreate(t)(c.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
	}, metav1.CreateOptions{}))
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("72"), corev1.ResourceMemory: resource.MustParse("480Gi"), corev1.ResourcePods: resource.MustParse("110")}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Capacity, n.Status.Allocatable = res, res
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	go lease.NewController(clock.RealClock{}, c, name, 40, nil, 10*time.Second, name, corev1.NamespaceNodeLease, nil).Run(ctx)
}

// createPairPod makes a claim for one GPU and one InfiniBand HCA matched
// on match, and a pod on node using it; tolerate adds a toleration of the
// gpudirect-not-ready taint to the HCA request.
func createPairPod(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, node, name string, match resourceapi.FullyQualifiedName, tolerate bool) {
	t.Helper()
	hcaReq := &resourceapi.ExactDeviceRequest{DeviceClassName: "ib.rdma.dra.dev"}
	if tolerate {
		hcaReq.Tolerations = []resourceapi.DeviceToleration{{Key: devices.DefaultDriverName + "/" + devices.TaintGPUDirectNotReady,
			Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}
	mustCreate(t)(c.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{
				{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuDriverName}},
				{Name: "hca", Exactly: hcaReq},
			},
			Constraints: []resourceapi.DeviceConstraint{{Requests: []string{"gpu", "hca"}, MatchAttribute: &match}},
		}},
	}, metav1.CreateOptions{}))
	mustCreate(t)(c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeSelector:  map[string]string{corev1.LabelHostname: node},
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"true"},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "pair"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "pair", ResourceClaimName: &name}},
		},
	}, metav1.CreateOptions{}))
}

// pairsPoll bounds each wait; the scheduler places a pod within seconds.
const pairsPoll = 60 * time.Second

func waitAllocated(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, name string) {
	t.Helper()
	poll.For(t, "pod "+name+" bound with its claim allocated", pairsPoll, func() (bool, string) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		cl, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if cl.Status.Allocation == nil || p.Spec.NodeName == "" {
			return false, fmt.Sprintf("nodeName %q, allocated %v, conditions %v", p.Spec.NodeName, cl.Status.Allocation != nil, p.Status.Conditions)
		}
		return true, ""
	})
}

func waitUnschedulable(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, name string) {
	t.Helper()
	poll.For(t, "pod "+name+" to be unschedulable", pairsPoll, func() (bool, string) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("pod %s was bound to %s: the taint did not keep it off", name, p.Spec.NodeName)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				return true, ""
			}
		}
		return false, fmt.Sprintf("conditions %v", p.Status.Conditions)
	})
}

// allocated is the GPU and HCA device of a claim.
func allocated(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, name string) (gpu, hcaDev string) {
	t.Helper()
	cl, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range cl.Status.Allocation.Devices.Results {
		switch r.Request {
		case "gpu":
			gpu = r.Device
		case "hca":
			hcaDev = r.Device
		}
	}
	return gpu, hcaDev
}
