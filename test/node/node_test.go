package node_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/node"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// TestNodeRunsPod: the real kubelet registers with the versions it is built
// with, runs a busybox pod on the CNI bridge, and its log comes back
// through the API server (pods/log, proxied to the kubelet).
func TestNodeRunsPod(t *testing.T) {
	if err := node.Check(); err != nil {
		t.Skipf("needs a machine that can run a real node (root, runc, iproute2, static busybox): %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := cluster.StartControlPlaneWith(t, t.TempDir(), node.ControlPlaneOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	t.Cleanup(cancel) // controllers stop before the API server does
	if err := cluster.StartControllers(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if err := cluster.StartNodeControllers(ctx, cp); err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(ctx, t, cp, node.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := got.Status.NodeInfo
	if info.KubeletVersion != node.KubeletVersion || info.ContainerRuntimeVersion != "containerd://"+node.ContainerdVersion {
		t.Errorf("node reports kubelet %q, runtime %q", info.KubeletVersion, info.ContainerRuntimeVersion)
	}

	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: v1.PodSpec{
			RestartPolicy: v1.RestartPolicyNever,
			Containers: []v1.Container{{
				Name: "hello", Image: "busybox", ImagePullPolicy: v1.PullNever,
				Command: []string{"sh", "-c", "echo hello from $(hostname); ip -4 addr show eth0 | grep -c inet"},
			}},
			NodeName: n.Name,
		},
	}
	start := time.Now()
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	phase := waitPod(t, cp, "default", "hello")
	t.Logf("pod hello: %s after %s", phase, time.Since(start).Round(10*time.Millisecond))
	if phase != v1.PodSucceeded {
		t.Fatalf("pod hello: %s", phase)
	}
	logs := podLogs(t, cp, "default", "hello", "hello")
	if !strings.Contains(logs, "hello from hello") || !strings.Contains(logs, "\n1") {
		t.Errorf("pod log %q: want the greeting and one IPv4 address on eth0", logs)
	}

	// Restarts: a running pod keeps its container through a kubelet and a
	// containerd restart.
	sleeper := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper", Namespace: "default"},
		Spec: v1.PodSpec{
			NodeName:   n.Name,
			Containers: []v1.Container{{Name: "c", Image: "busybox", ImagePullPolicy: v1.PullNever, Command: []string{"sleep", "3600"}}},
		},
	}
	start = time.Now()
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, sleeper, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := func() (string, bool) {
		p, err := cp.Client.CoreV1().Pods("default").Get(ctx, "sleeper", metav1.GetOptions{})
		if err != nil || p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
			return "", false
		}
		return p.Status.ContainerStatuses[0].ContainerID, true
	}
	var id string
	poll.For(t, "pod sleeper to run", time.Minute, func() (bool, string) {
		id, _ = running()
		return id != "", ""
	})
	t.Logf("pod sleeper: Running %s after its creation", time.Since(start).Round(10*time.Millisecond))
	start = time.Now()
	n.StopKubelet()
	if err := n.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kubelet restarted, node Ready in %s", time.Since(start).Round(10*time.Millisecond))
	start = time.Now()
	n.StopContainerd()
	if err := n.StartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("containerd restarted in %s", time.Since(start).Round(10*time.Millisecond))
	if out, err := n.Ctr(ctx, "tasks", "ls"); err != nil || !strings.Contains(out, strings.TrimPrefix(id, "containerd://")) {
		t.Errorf("after the restarts, containerd's tasks lack the sleeper's container %s: %v\n%s", id, err, out)
	}
	time.Sleep(3 * time.Second) // a sync or two of the new kubelet
	if got, ok := running(); !ok || got != id {
		t.Errorf("after the restarts the sleeper's container is %q (running %v), want %q still running", got, ok, id)
	}
}

func waitPod(t *testing.T, cp *cluster.ControlPlane, ns, name string) v1.PodPhase {
	t.Helper()
	var phase v1.PodPhase
	poll.For(t, "pod "+ns+"/"+name+" to finish", 2*time.Minute, func() (bool, string) {
		p, err := cp.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		phase = p.Status.Phase
		return phase == v1.PodSucceeded || phase == v1.PodFailed, string(phase)
	})
	return phase
}

func podLogs(t *testing.T, cp *cluster.ControlPlane, ns, name, container string) string {
	t.Helper()
	rc, err := cp.Client.CoreV1().Pods(ns).GetLogs(name, &v1.PodLogOptions{Container: container}).Stream(context.Background())
	if err != nil {
		t.Fatalf("pods/log of %s/%s: %v", ns, name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
