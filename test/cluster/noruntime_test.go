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
// description is the container's output. It needs neither root nor runc
// and never skips.
func TestNodeAgentNoRuntime(t *testing.T) {
	e := naStartAgent(t, true)
	pod, _ := e.claimedPod("dry", "mlx5-3", true, "ls /dev/infiniband")
	e.waitFor("the pod to succeed", 2*time.Minute, func() (bool, string) {
		p := e.pod(pod.Name)
		return p.Status.Phase == corev1.PodSucceeded, string(p.Status.Phase)
	})
	out := e.agent.Logs("default", pod.Name, "main")
	t.Logf("container output:\n%s", out)
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, ":")
		lines[k] = strings.TrimSpace(v)
	}
	if got := lines["devices"]; got != "/dev/infiniband/rdma_cm /dev/infiniband/uverbs3" {
		t.Errorf("devices: %q, want exactly rdma_cm and uverbs3 (the claim's mlx5_3)", got)
	}
	env := strings.Fields(lines["env"])
	if !slicesContains(env, "RDMA_DEVICES=mlx5_3") {
		t.Errorf("env: %q, want RDMA_DEVICES=mlx5_3 (the claim's HCA)", lines["env"])
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			t.Errorf("env: %q lists PATH, which neither the driver nor CDI set", lines["env"])
		}
	}
	if !strings.Contains(lines["cdi"], "rdma.dra.dev/") {
		t.Errorf("cdi: %q, want the claim's CDI device", lines["cdi"])
	}
	if !slicesContains(strings.Fields(lines["capabilities"]), "CAP_IPC_LOCK") {
		t.Errorf("capabilities: %q, want CAP_IPC_LOCK (the pod adds it)", lines["capabilities"])
	}
}

func slicesContains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
