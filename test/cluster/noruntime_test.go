package cluster

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestNodeAgentNoRuntime: without runc the agent still goes the kubelet's
// whole way up to the container: the DRA manager prepares the claim through
// the real driver, the CDI library injects the claim's spec, and the spec's
// description is the container's output. It needs neither root nor runc.
func TestNodeAgentNoRuntime(t *testing.T) {
	e := naStartAgent(t, true)
	pod, _ := e.claimedPod("dry", "mlx5-3", true, "ls /dev/infiniband")
	e.waitFor("the pod to succeed", 2*time.Minute, func() (bool, string) {
		p := e.pod(pod.Name)
		return p.Status.Phase == corev1.PodSucceeded, string(p.Status.Phase)
	})
	out := e.agent.Logs("default", pod.Name, "main")
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, ": ")
		lines[k] = v
	}
	if got := lines["devices"]; got != "/dev/infiniband/rdma_cm /dev/infiniband/uverbs3" {
		t.Errorf("devices: %q, want rdma_cm and uverbs3 (the claim's mlx5_3)\n%s", got, out)
	}
	if !strings.Contains(" "+lines["env"]+" ", " RDMA_DEVICES=mlx5_3 ") {
		t.Errorf("env: %q, want RDMA_DEVICES=mlx5_3\n%s", lines["env"], out)
	}
	if !strings.Contains(lines["capabilities"], "CAP_IPC_LOCK") {
		t.Errorf("capabilities: %q, want CAP_IPC_LOCK (the pod adds it)", lines["capabilities"])
	}
}
