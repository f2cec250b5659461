package e2e

// Tenancy on the real node: admin-only grants hold per namespace, and the
// daemon's own token reaches only claims of its node.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

const (
	mgmtClass          = "mgmt.rdma.dra.dev"
	adminGrantsAllowed = "rdma.dra.dev/admin-grants-allowed"
)

// TestRealNodeGrantByNamespace: the chart's management class grants
// umad/issm. A claim, or a claim template, naming it from a namespace
// without the allowing label is refused at admission, saying which class,
// namespace and label; in a labelled namespace its pod runs with umad and
// issm.
func TestRealNodeGrantByNamespace(t *testing.T) {
	t.Parallel() // a real node of its own: see parallel in main_test.go
	w := newRealWorld(t)
	w.install(t, "rdma-grants", `,"deviceClasses":{"management":true}`)

	w.namespace(t, "tenant", nil)
	w.namespace(t, "fabric-admin", map[string]string{adminGrantsAllowed: "true"})

	_, err := w.cp.Client.ResourceV1().ResourceClaims("tenant").Create(w.ctx, hcaClaim("tenant", "mad", mgmtClass), metav1.CreateOptions{})
	wantRefusal(t, err, "ResourceClaim tenant/mad names DeviceClass "+mgmtClass, "namespace tenant lacks the label "+adminGrantsAllowed+"=true")
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "mad", Namespace: "tenant"},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: hcaClaim("tenant", "", mgmtClass).Spec},
	}
	_, err = w.cp.Client.ResourceV1().ResourceClaimTemplates("tenant").Create(w.ctx, tmpl, metav1.CreateOptions{})
	wantRefusal(t, err, "ResourceClaimTemplate tenant/mad names DeviceClass "+mgmtClass)
	// The same tenant's ordinary class is not the policy's business.
	if _, err := w.cp.Client.ResourceV1().ResourceClaims("tenant").Create(w.ctx, hcaClaim("tenant", "plain", "ib.rdma.dra.dev"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a claim on ib.rdma.dra.dev in namespace tenant: %v", err)
	}

	if _, err := w.cp.Client.ResourceV1().ResourceClaims("fabric-admin").Create(w.ctx, hcaClaim("fabric-admin", "mad", mgmtClass), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a claim on %s in the labelled namespace: %v", mgmtClass, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sm-tools", Namespace: "fabric-admin"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, HostNetwork: true, TerminationGracePeriodSeconds: ptr(int64(1)),
			ResourceClaims: []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimName: ptr("mad")}},
			Containers: []corev1.Container{{Name: "c", Image: "busybox", ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", "ls /dev/infiniband | tr '\\n' ' '; echo; sleep 1000"},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "rdma"}}}}}},
	}
	if _, err := w.cp.Client.CoreV1().Pods("fabric-admin").Create(w.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var seen string
	poll.For(t, "pod fabric-admin/sm-tools to list its devices", 2*time.Minute, func() (bool, string) {
		p, err := w.cp.Client.CoreV1().Pods("fabric-admin").Get(w.ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning {
			return false, fmt.Sprintf("%v %v", err, p.Status)
		}
		b, err := w.cp.Client.CoreV1().Pods("fabric-admin").GetLogs(pod.Name, &corev1.PodLogOptions{Container: "c"}).DoRaw(w.ctx)
		seen = string(b)
		return err == nil && strings.Contains(seen, "uverbs"), fmt.Sprintf("log %q, %v", seen, err)
	})
	if !strings.Contains(seen, "umad") || !strings.Contains(seen, "issm") {
		t.Errorf("the labelled namespace's pod sees %q, want umad and issm from the class's grant", seen)
	}
	t.Logf("tenant refused; fabric-admin's pod sees %s", strings.TrimSpace(seen))
}

// TestDaemonTokenOtherNode: the daemon's own ServiceAccount token, as the
// kubelet wrote it into the daemon's pod, patches status.devices of a claim
// allocated on its node, and is refused (403) for a claim allocated on
// another node, and for reservedFor of any claim. The API server (1.37)
// authorizes status per node and driver; the chart grants only the
// node-aware verb.
func TestDaemonTokenOtherNode(t *testing.T) {
	t.Parallel() // a real node of its own: see parallel in main_test.go
	w := newRealWorld(t)
	w.install(t, "rdma-token", "")
	daemon := w.daemonClient(t)

	own := w.allocatedClaim(t, "on-own-node", w.n.Name)
	other := w.allocatedClaim(t, "on-other-node", "gpu-node-7")

	if err := patchDeviceStatus(w, daemon, own); err != nil {
		t.Errorf("the daemon's token patching status.devices of a claim on its own node %s: %v", w.n.Name, err)
	}
	err := patchDeviceStatus(w, daemon, other)
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || err == nil || !strings.Contains(err.Error(), "resourceclaims/driver") {
		t.Errorf("the daemon's token patching status.devices of a claim on node gpu-node-7: %v, want 403 naming resourceclaims/driver", err)
	}
	for _, c := range []*resourceapi.ResourceClaim{own, other} {
		patch := []byte(`{"status":{"reservedFor":null}}`)
		_, err := daemon.ResourceV1().ResourceClaims(c.Namespace).Patch(w.ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
		if err == nil || !strings.Contains(err.Error(), "resourceclaims/binding") {
			t.Errorf("the daemon's token emptying reservedFor of %s: %v, want a refusal naming resourceclaims/binding", c.Name, err)
		}
		got, gerr := w.cp.Client.ResourceV1().ResourceClaims(c.Namespace).Get(w.ctx, c.Name, metav1.GetOptions{})
		if gerr != nil || len(got.Status.ReservedFor) != 1 {
			t.Errorf("claim %s after the refused patch: reservedFor %v (%v), want its pod", c.Name, got.Status.ReservedFor, gerr)
		}
	}
	got, err := w.cp.Client.ResourceV1().ResourceClaims("default").Get(w.ctx, other.Name, metav1.GetOptions{})
	if err != nil || len(got.Status.Devices) != 0 {
		t.Errorf("claim on gpu-node-7 after the refused patch: status.devices %v (%v), want none", got.Status.Devices, err)
	}
}

func (w *realWorld) namespace(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := w.cp.Client.CoreV1().Namespaces().Create(w.ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.For(t, "the default ServiceAccount of namespace "+name, time.Minute, func() (bool, string) {
		_, err := w.cp.Client.CoreV1().ServiceAccounts(name).Get(w.ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
}

func hcaClaim(namespace, name, class string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "hca", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}},
		}},
	}
}

func wantRefusal(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("created, want a refusal saying %q", want)
		return
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("%v: want 403 or 422 from the admission policy", err)
	}
	for _, s := range want {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("refusal %q lacks %q", err, s)
		}
	}
}

// daemonClient is a client with the token the kubelet projected into the
// driver's container, read where the daemon reads it (through the
// container's root: the projected volume is a tmpfs of the node's mount
// namespace).
func (w *realWorld) daemonClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	pod := w.driverPod(t)
	pid := w.taskPid(t, pod.Status.ContainerStatuses[0].ContainerID)
	token, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "root", "var/run/secrets/kubernetes.io/serviceaccount/token"))
	if err != nil {
		t.Fatalf("the driver container's ServiceAccount token: %v", err)
	}
	cfg := rest.AnonymousClientConfig(w.cp.Config)
	cfg.BearerToken = strings.TrimSpace(string(token))
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ResourceV1().ResourceClaims("default").Get(w.ctx, "nonexistent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the daemon's token cannot even get claims (%v): not the chart's RBAC", err)
	}
	return c
}

// allocatedClaim creates a claim and, as the scheduler would, allocates
// one of this node's HCAs to it on node and reserves it for a pod.
func (w *realWorld) allocatedClaim(t *testing.T, name, node string) *resourceapi.ResourceClaim {
	t.Helper()
	c, err := w.cp.Client.ResourceV1().ResourceClaims("default").Create(w.ctx, hcaClaim("default", name, "hca.rdma.dra.dev"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "hca", Driver: "rdma.dra.dev", Pool: node, Device: "mlx5-0"}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}},
	}
	// A pod that exists (the claim controller drops reservations of pods
	// that do not) and never runs: no node matches it.
	pod, err := w.cp.Client.CoreV1().Pods("default").Create(w.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-pod"},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{"rdma.dra.dev/test": "no-such-node"},
			Containers: []corev1.Container{{Name: "c", Image: "busybox", ImagePullPolicy: corev1.PullNever}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if c, err = w.cp.Client.ResourceV1().ResourceClaims("default").UpdateStatus(w.ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// patchDeviceStatus writes status.devices of the claim's device as the
// driver does (an HCA's netdev).
func patchDeviceStatus(w *realWorld, c kubernetes.Interface, claim *resourceapi.ResourceClaim) error {
	r := claim.Status.Allocation.Devices.Results[0]
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"devices": []resourceapi.AllocatedDeviceStatus{{
		Driver: r.Driver, Pool: r.Pool, Device: r.Device,
		NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "ib0"}}}}})
	_, err := c.ResourceV1().ResourceClaims(claim.Namespace).Patch(w.ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}
