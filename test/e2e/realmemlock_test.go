package e2e

// The hook's memlock on a real runtime (docs/security.md, "Memlock"): the
// container gets its RLIMIT_MEMLOCK from the hook, so it needs no
// capability; where the hook cannot give what a class asks, the container
// fails at its start with the hook's message.

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// limitsScript prints what the container's process holds, then waits.
// Opening each node tells a permission refusal ("Permission denied") from
// the simulated node's missing kernel driver ("No such device").
const limitsScript = `grep 'Max locked memory' /proc/self/limits; grep CapEff /proc/self/status; id -u; ls -ln /dev/infiniband; ` +
	`for f in /dev/infiniband/*; do (: <> $f) 2>&1; done; grep ' /dev/shm ' /proc/mounts; echo x > /dev/shm/probe && echo shm-writable; ls /dev/infiniband | tr '\n' ' '; echo; echo ready; sleep 3600`

// memlockClass creates a DeviceClass of every HCA whose config sets memlock.
func (w *realWorld) memlockClass(t *testing.T, name, memlock string) {
	t.Helper()
	cfg := fmt.Sprintf(`{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","memlock":%q}`, memlock)
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "rdma.dra.dev"`}}},
			Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: "rdma.dra.dev", Parameters: runtime.RawExtension{Raw: []byte(cfg)}}}}},
		},
	}
	if _, err := w.cp.Client.ResourceV1().DeviceClasses().Create(w.ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.cp.Client.ResourceV1().DeviceClasses().Delete(w.ctx, name, metav1.DeleteOptions{}) })
}

// restricted makes the pod's container what the restricted Pod Security
// Standard allows: a non-root user, every capability dropped, no privilege
// escalation, the runtime's seccomp profile.
func restricted(p *corev1.Pod) {
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr(true), RunAsUser: ptr(int64(1000)), RunAsGroup: ptr(int64(1000)),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr(false),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	p.Spec.Containers[0].Command = []string{"sh", "-c", limitsScript}
}

// waitLog waits for the pod's container c to print a line matching re.
func (w *realWorld) waitLog(t *testing.T, pod string, re *regexp.Regexp) string {
	t.Helper()
	var log string
	poll.For(t, fmt.Sprintf("pod %s to print %s", pod, re), 2*time.Minute, func() (bool, string) {
		b, err := w.cp.Client.CoreV1().Pods("default").GetLogs(pod, &corev1.PodLogOptions{Container: "c"}).DoRaw(w.ctx)
		if err != nil {
			return false, err.Error() + "; " + w.events(pod)
		}
		log = string(b)
		return re.MatchString(log), log
	})
	return log
}

// A non-root container with every capability dropped gets the memlock of
// its claim's DeviceClass and the /dev/shm its claim asks for (below what the host allows, so the hook's own
// setting shows), and the node's --memlock through the device plugin. A
// class asking more than this host can give (here: no CAP_SYS_RESOURCE,
// so no hard limit goes up) fails the container at its start with the
// hook's message naming the container and the HCA; it never runs.
func (w *realWorld) policyMemlock(t *testing.T) {
	w.memlockClass(t, "memlock-4mi.rdma.dra.dev", "4Mi")
	w.createClaim(t, "memlock-4mi", "memlock-4mi.rdma.dra.dev", `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","shmSizeMiB":96}`)
	w.policyPod(t, "locked-4mi", true, withClaim("memlock-4mi"), restricted)
	log := w.waitLog(t, "locked-4mi", regexp.MustCompile(`(?m)^ready$`))
	t.Logf("locked-4mi (uid 1000, capabilities dropped):\n%s", log)
	if !regexp.MustCompile(`Max locked memory\s+4194304\s+4194304\s+bytes`).MatchString(log) || !strings.Contains(log, "CapEff:\t0000000000000000") || !strings.Contains(log, "\n1000\n") {
		t.Errorf("locked-4mi: want memlock 4194304 (soft and hard) from its class, CapEff 0 and uid 1000; got\n%s", log)
	}
	// Its /dev/shm: the claim's 96 MiB tmpfs, in place of the runtime's.
	if !regexp.MustCompile(`(?m)^shm /dev/shm tmpfs rw,nosuid,nodev,noexec\S*,size=98304k`).MatchString(log) || !strings.Contains(log, "shm-writable") {
		t.Errorf("locked-4mi: want /dev/shm a 96 MiB tmpfs its user writes to; got\n%s", log)
	}
	// Its nodes: the host's mode (0666 from udev), owned by the container's
	// user, opened without a permission error.
	if !regexp.MustCompile(`crw-rw-rw-\s+1 1000\s+1000\s+231,\s+\d+ .* uverbs\d`).MatchString(log) || !regexp.MustCompile(`crw-rw-rw-\s+1 1000\s+1000\s+10,\s+58 .* rdma_cm`).MatchString(log) ||
		strings.Contains(log, "Permission denied") {
		t.Errorf("locked-4mi: want uverbs and rdma_cm mode 0666 owned by 1000 and no permission error; got\n%s", log)
	}

	if w.memlock != "unlimited" {
		w.policyPod(t, "dp-locked", true, withDevicePlugin, restricted)
		log = w.waitLog(t, "dp-locked", regexp.MustCompile(`(?m)^ready$`))
		if want := regexp.MustCompile(`Max locked memory\s+` + w.memlock + `\s+` + w.memlock + `\s+bytes`); !want.MatchString(log) {
			t.Errorf("dp-locked (device plugin): want the node's memlock %s; got\n%s", w.memlock, log)
		}
	}

	if w.memlock == "unlimited" {
		t.Logf("not trying a class beyond the host's limit: this host lets the hook raise any limit")
		return
	}
	w.memlockClass(t, "memlock-unlimited.rdma.dra.dev", "unlimited")
	w.createClaim(t, "memlock-unlimited", "memlock-unlimited.rdma.dra.dev")
	w.policyPod(t, "beyond-host", true, withClaim("memlock-unlimited"), restricted)
	w.waitWarning(t, "beyond-host", "rdma-dra-hook:", "cannot set the memlock limit of container c of pod default/beyond-host", "to unlimited",
		"needs CAP_SYS_RESOURCE", "HCA mlx5_")
	w.neverRan(t, "beyond-host", "c")
}

// ACK's example Job, rewritten for DRA and without its boilerplate
// (demo/specs/10-job-dra.yaml), in a namespace enforcing the restricted Pod
// Security Standard: the API server admits it, and its container, a
// non-root user with no capability at all, sees rdma_cm and exactly its
// claim's uverbsN, with the memlock the hook gives and its claim's 8 GiB
// /dev/shm. It runs on the pod network, so where non-hostNetwork RDMA is on.
func (w *realWorld) seedJobDRA(t *testing.T) {
	w.enforce(t, "restricted")
	applyPulling(w.ctx, t, w.cp, w.dir, "demo/specs/10-job-dra.yaml")
	pod := waitJobPod(w.ctx, t, w.cp, "hps-benchmark")
	out := realPodLogs(w.ctx, t, w.cp, pod.Name, "hps-benchmark")
	t.Logf("hps-benchmark's log (pods/log from the kubelet):\n%s", out)
	allocated := w.claims.devices(pod.Name)
	if len(allocated) != 1 || w.devices[allocated[0]].Uverbs == nil {
		t.Fatalf("the claim of pod %s got devices %v, want one HCA (recorded: %v)", pod.Name, allocated, w.claims.all())
	}
	want := []string{"rdma_cm", w.devices[allocated[0]].Uverbs.Name}
	if got := infinibandListing(out); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("/dev/infiniband in the container = %v, want %v (claim's device %s)", got, want, allocated[0])
	}
	if c := capEff(t, out); c != 0 {
		t.Errorf("CapEff %016x, want 0000000000000000:\n%s", c, out)
	}
	if w.memlock != "unlimited" && !regexp.MustCompile(`Max locked memory\s+`+w.memlock+`\s+`+w.memlock+`\s+bytes`).MatchString(out) {
		t.Errorf("want the memlock %s the hook gives:\n%s", w.memlock, out)
	}
	if !regexp.MustCompile(`(?m)^shm\s+8192\s`).MatchString(out) {
		t.Errorf("want an 8192 MiB /dev/shm from the claim's shmSizeMiB:\n%s", out)
	}
}

// enforce labels namespace default with a Pod Security enforce level for
// the rest of the test.
func (w *realWorld) enforce(t *testing.T, level string) {
	t.Helper()
	const key = "pod-security.kubernetes.io/enforce"
	set := func(v string) error {
		ns, err := w.cp.Client.CoreV1().Namespaces().Get(w.ctx, "default", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		if v == "" {
			delete(ns.Labels, key)
		} else {
			ns.Labels[key] = v
		}
		_, err = w.cp.Client.CoreV1().Namespaces().Update(w.ctx, ns, metav1.UpdateOptions{})
		return err
	}
	if err := set(level); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := set(""); err != nil {
			t.Errorf("removing the namespace's enforce label: %v", err)
		}
	})
}
