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
const limitsScript = `grep 'Max locked memory' /proc/self/limits; grep CapEff /proc/self/status; id -u; ls /dev/infiniband | tr '\n' ' '; echo; sleep 3600`

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
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr(true), RunAsUser: ptr(int64(1000)),
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
// its claim's DeviceClass (below what the host allows, so the hook's own
// setting shows), and the node's --memlock through the device plugin. A
// class asking more than this host can give (here: no CAP_SYS_RESOURCE,
// so no hard limit goes up) fails the container at its start with the
// hook's message naming the container and the HCA; it never runs.
func (w *realWorld) policyMemlock(t *testing.T) {
	w.memlockClass(t, "memlock-4mi.rdma.dra.dev", "4Mi")
	w.createClaim(t, "memlock-4mi", "memlock-4mi.rdma.dra.dev")
	w.policyPod(t, "locked-4mi", true, withClaim("memlock-4mi"), restricted)
	log := w.waitLog(t, "locked-4mi", regexp.MustCompile(`uverbs`))
	t.Logf("locked-4mi (uid 1000, capabilities dropped):\n%s", log)
	if !regexp.MustCompile(`Max locked memory\s+4194304\s+4194304\s+bytes`).MatchString(log) || !strings.Contains(log, "CapEff:\t0000000000000000") || !strings.Contains(log, "\n1000\n") {
		t.Errorf("locked-4mi: want memlock 4194304 (soft and hard) from its class, CapEff 0 and uid 1000; got\n%s", log)
	}

	if w.memlock != "unlimited" {
		w.policyPod(t, "dp-locked", true, withDevicePlugin, restricted)
		log = w.waitLog(t, "dp-locked", regexp.MustCompile(`uverbs`))
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
