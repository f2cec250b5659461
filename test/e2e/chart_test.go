package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// renderChart renders the Helm chart with the Helm Go SDK (test/helmrender,
// its own module) into a file.
func renderChart(t *testing.T, values string) string {
	t.Helper()
	root := cluster.RepoRoot()
	cmd := exec.Command("go", "run", ".", "--chart", filepath.Join(root, "deployments", "helm", "rdma-dra-driver"),
		"--namespace", "rdma-system", "--values", values)
	cmd.Dir = filepath.Join(root, "test", "helmrender")
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("rendering the chart with %s: %v\n%s", values, err, stderr)
	}
	f := filepath.Join(t.TempDir(), "chart.yaml")
	if err := os.WriteFile(f, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// podPolicyOf writes the documents of the pod policy (and its binding) of
// a rendered chart into a file of their own.
func podPolicyOf(t *testing.T, rendered string) string {
	t.Helper()
	b, err := os.ReadFile(rendered)
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, d := range strings.Split(string(b), "\n---\n") {
		if strings.Contains(d, "kind: ValidatingAdmissionPolicy") && strings.Contains(d, "name: rdma-pod-rdma\n") {
			docs = append(docs, d)
		}
	}
	if len(docs) != 2 {
		t.Fatalf("%s: %d documents of the pod policy, want the policy and its binding", rendered, len(docs))
	}
	f := filepath.Join(t.TempDir(), "pod-policy.yaml")
	if err := os.WriteFile(f, []byte(strings.Join(docs, "\n---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestChartAcceptedAndPoliciesAct: for each values case every rendered
// object passes the real API server's validation and admission (server-side
// dry-run); then, installed for real, the pod policy denies an RDMA pod
// without IPC_LOCK where the hook gives no memlock (memlock: off) and
// admits it where it does (the default), and the slice policy refuses a daemon's token writing
// another node's ResourceSlice.
func TestChartAcceptedAndPoliciesAct(t *testing.T) {
	t.Parallel() // no node: see parallel in main_test.go
	cp, err := cluster.StartControlPlane(t, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	ctx := context.Background()
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rdma-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, values := range []string{
		`{}`,
		`{"sharing":"shared","legacy":{"route":"dra"}}`,
		`{"sharing":"shared","legacy":{"route":"device-plugin"},"allowNonHostNetwork":true}`,
		`{"policies":{"podRDMA":{"action":"Deny","claimTemplates":["ib-400g"]}},"logging":{"format":"json"}}`,
		`{"memlock":"off","allowNonHostNetwork":true}`,
		`{"allowNonHostNetwork":true}`, // no pod policy: nothing to check
	} {
		objs, err := cluster.ApplyFiles(ctx, cp.Config, true, renderChart(t, values))
		if err != nil {
			t.Errorf("values %s: %v", values, err)
			continue
		}
		if len(objs) < 10 {
			t.Errorf("values %s: only %d objects", values, len(objs))
		}
	}

	if _, err := cluster.ApplyFiles(ctx, cp.Config, false, renderChart(t, `{"memlock":"off","policies":{"podRDMA":{"action":"Deny"}}}`)); err != nil {
		t.Fatal(err)
	}

	// The pod policy with memlock off: rdma/hca without IPC_LOCK is denied,
	// with it admitted.
	rdmaPod := func(name string, caps ...corev1.Capability) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{HostNetwork: true, Containers: []corev1.Container{{
				Name: "main", Image: "busybox",
				Resources:       corev1.ResourceRequirements{Limits: corev1.ResourceList{"rdma/hca": resource.MustParse("1")}},
				SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: caps}},
			}}},
		}
	}
	poll.For(t, "the pod policy to deny", 30*time.Second, func() (bool, string) {
		_, err := cp.Client.CoreV1().Pods("default").Create(ctx, rdmaPod(fmt.Sprintf("no-ipc-lock-%d", time.Now().UnixNano())), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "need securityContext.capabilities.add: [IPC_LOCK]") && strings.Contains(err.Error(), "main"), fmt.Sprint(err)
	})
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, rdmaPod("with-ipc-lock", "IPC_LOCK", "SYS_RESOURCE"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("a pod with IPC_LOCK was refused: %v", err)
	}
	plain := rdmaPod("podnet", "IPC_LOCK")
	plain.Spec.HostNetwork = false
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, plain, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil || !strings.Contains(err.Error(), "allowNonHostNetwork=true") {
		t.Errorf("a non-hostNetwork RDMA pod: err %v, want the hostNetwork message", err)
	}

	// Init containers are covered too (the device plugin hands them HCAs
	// as it does any container). Ephemeral containers cannot ask for
	// resources at all: the API refuses that before admission.
	initPod := rdmaPod("init-podnet", "IPC_LOCK")
	initPod.Spec.HostNetwork = false
	initPod.Spec.InitContainers = []corev1.Container{initPod.Spec.Containers[0]}
	initPod.Spec.InitContainers[0].Name = "setup"
	initPod.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, initPod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil ||
		!strings.Contains(err.Error(), "allowNonHostNetwork=true") || !strings.Contains(err.Error(), "containers using it: setup") {
		t.Errorf("an init container using RDMA off the host network: err %v, want the hostNetwork message naming setup", err)
	}
	initPod.Spec.HostNetwork = true
	initPod.Spec.InitContainers[0].SecurityContext = nil
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, initPod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil ||
		!strings.Contains(err.Error(), "[IPC_LOCK] to pin memory (Helm value memlock: off, so the hook sets no memlock): setup") {
		t.Errorf("an init container using RDMA without IPC_LOCK: err %v, want the IPC_LOCK message naming setup", err)
	}

	// The default, the hook giving memlock: no capability needed, the
	// hostNetwork check kept. The pod policy of those values replaces the
	// one above (an upgrade's effect on it).
	if err := cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, "rdma-pod-rdma", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, "rdma-pod-rdma", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.ApplyFiles(ctx, cp.Config, false, podPolicyOf(t, renderChart(t, `{"policies":{"podRDMA":{"action":"Deny"}}}`))); err != nil {
		t.Fatal(err)
	}
	// The new policy acts once it denies a pod off the host network, with
	// the hostNetwork message alone; then a hostNetwork pod without any
	// capability is admitted.
	plain = rdmaPod("podnet-no-caps")
	plain.Spec.HostNetwork = false
	poll.For(t, "the new pod policy to deny a non-hostNetwork RDMA pod, asking for no IPC_LOCK", 30*time.Second, func() (bool, string) {
		_, err := cp.Client.CoreV1().Pods("default").Create(ctx, plain, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "allowNonHostNetwork=true") && !strings.Contains(err.Error(), "IPC_LOCK"), fmt.Sprint(err)
	})
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, rdmaPod("no-caps"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("a hostNetwork RDMA pod without capabilities, memlock given: %v", err)
	}

	// The slice policy: a token of the daemon's service account, bound to a
	// pod on node n1, may write n1's slices and not n2's.
	client := daemonClient(t, cp, "n1")
	slice := func(node string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: node + "-rdma"},
			Spec: resourceapi.ResourceSliceSpec{Driver: "rdma.dra.dev", NodeName: &node,
				Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}},
		}
	}
	poll.For(t, "the slice policy to refuse another node", 30*time.Second, func() (bool, string) {
		_, err := client.ResourceV1().ResourceSlices().Create(ctx, slice("n2"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "on node n1 may not write ResourceSlices of node n2"), fmt.Sprint(err)
	})
	if _, err := client.ResourceV1().ResourceSlices().Create(ctx, slice("n1"), metav1.CreateOptions{}); err != nil {
		t.Errorf("the daemon on n1 could not write n1's slice: %v", err)
	}
	// Nor another driver's slices, nor another pool, on its own node.
	other := slice("n1")
	other.Name, other.Spec.Driver = "n1-other", "gpu.example.com"
	if _, err := client.ResourceV1().ResourceSlices().Create(ctx, other, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil ||
		!strings.Contains(err.Error(), "may only write ResourceSlices of driver rdma.dra.dev, not gpu.example.com") {
		t.Errorf("the daemon writing another driver's slice: %v", err)
	}
	pool := slice("n1")
	pool.Name, pool.Spec.Pool.Name = "n1-pool", "n2"
	if _, err := client.ResourceV1().ResourceSlices().Create(ctx, pool, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil ||
		!strings.Contains(err.Error(), "may only write ResourceSlices of pool n1, not n2") {
		t.Errorf("the daemon writing a slice of another pool: %v", err)
	}
}

// daemonClient returns a client with a token of the chart's service
// account bound to a pod scheduled on node, as the DaemonSet pod has.
func daemonClient(t *testing.T, cp *cluster.ControlPlane, node string) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cp.Client.CoreV1().Pods("rdma-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "rdma-node-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "rdma-node",
			Containers: []corev1.Container{{Name: "driver", Image: "rdma-dra-driver"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cp.Client.CoreV1().ServiceAccounts("rdma-system").CreateToken(ctx, "rdma-node", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tr.Status.Token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
