package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// world is an in-process control plane around one simulated dgx-h100 node
// and the driver binary built for it, run as a plain process: the test
// itself plays the kubelet on the driver's sockets (kubeletclient_test.go,
// rolling_test.go). The node scenarios run on a real node: realWorld.
type world struct {
	t          *testing.T
	cp         *cluster.ControlPlane
	binary     string
	args       []string
	kubeletDir string
	cdiDir     string
	proc       *cluster.DriverProcess
	sim        *hcatest.Node
	dir        string
}

func newBareWorld(t *testing.T, driverArgs ...string) *world {
	t.Helper()
	dir, err := os.MkdirTemp("", "w") // short: unix socket paths live under it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cp, err := cluster.StartControlPlane(t, filepath.Join(dir, "cp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	spec, _ := hcatest.Preset("dgx-h100")
	sim, err := hcatest.Build(filepath.Join(dir, "node"), spec)
	if err != nil {
		t.Fatal(err)
	}
	binary, err := cluster.BuildDriver(dir)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, cp: cp, binary: binary, cdiDir: filepath.Join(dir, "cdi"), kubeletDir: filepath.Join(dir, "k"), sim: sim, dir: dir}
	w.args = append([]string{"--node-name=" + nodeName, "--kubeconfig=" + cp.Kubeconfig,
		"--sysfs-root=" + sim.SysfsRoot, "--dev-root=" + sim.DevRoot, "--cdi-root=" + w.cdiDir,
		"--kubelet-root-dir=" + w.kubeletDir, "--metrics-address=127.0.0.1:0", "--healthz-address=127.0.0.1:0"}, driverArgs...)
	t.Cleanup(func() {
		if w.proc != nil {
			if t.Failed() {
				t.Logf("driver logs:\n%s", w.proc.Logs())
			}
			w.proc.Kill()
		}
	})
	return w
}

func (w *world) startDriver() {
	w.t.Helper()
	p, err := cluster.StartDriver(w.binary, w.args...)
	if err != nil {
		w.t.Fatal(err)
	}
	w.proc = p
}

// wait polls cond until it holds; a driver that exits meanwhile fails the
// test at once, with its logs.
func (w *world) wait(what string, d time.Duration, cond func() (bool, string)) {
	w.t.Helper()
	poll.For(w.t, what, d, func() (bool, string) {
		if w.proc != nil {
			if exited, err := w.proc.Exited(); exited {
				w.t.Fatalf("driver exited (%v) while waiting for %s:\n%s", err, what, w.proc.Logs())
			}
		}
		return cond()
	})
}

func infinibandListing(out string) []string {
	var names []string
	for _, l := range strings.Split(out, "\n") {
		if l == "rdma_cm" || strings.HasPrefix(l, "uverbs") || strings.HasPrefix(l, "umad") || strings.HasPrefix(l, "issm") {
			names = append(names, l)
		}
	}
	return names
}

func capEff(t *testing.T, out string) uint64 {
	t.Helper()
	m, err := cluster.ParseCapMask(out, "CapEff")
	if err != nil {
		t.Fatalf("no CapEff in output %q: %v", out, err)
	}
	return m
}

func ptr[T any](v T) *T { return &v }

// claimPod is a pod with its own claim from the ib-400g template (the
// demo's, see realWorld.ensureTemplate) running a shell command.
func claimPod(name string, hostNetwork bool, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, HostNetwork: hostNetwork,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimTemplateName: ptr("ib-400g")}},
			Containers: []corev1.Container{{Name: "c", Image: "busybox", Command: []string{"sh", "-c", script},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "rdma"}}}}}},
	}
}
