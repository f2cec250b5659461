package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// TestRealNodeReboot reboots the real node with claims prepared: the
// kubelet, containerd and every pod (the driver's too) die, the tmpfs CDI
// dir is emptied, the boot ID changes, and everything starts again. A pod
// deleted while the node was down is not started again. The driver
// discards the previous boot's claims (one log line, the metric), the
// kubelet prepares again the claims of the pods still bound to the node,
// whose new containers see their HCAs, and unprepares the deleted pod's;
// nothing leaks.
func TestRealNodeReboot(t *testing.T) {
	t.Parallel() // a real node of its own: see parallel in main_test.go
	w := newRealWorld(t)
	bootFile := filepath.Join(w.dir, "boot_id")
	const bootA, bootB = "0f3b2c4d-1111-4a5b-8c9d-0123456789ab\n", "7e6d5c4b-2222-4a5b-8c9d-ba9876543210\n"
	if err := os.WriteFile(bootFile, []byte(bootA), 0o644); err != nil {
		t.Fatal(err)
	}
	w.install(t, "rdma", fmt.Sprintf(`,"bootIDFile":%q`, bootFile))

	names, uids, want := w.longPods(t, "rb", 3)
	w.checkPrepared(t, uids)
	ids := w.containerIDs(t, names)
	if d := w.metric(t, w.driverPod(t), "rdma_dra_reboot_discarded_claims_total"); d != 0 {
		t.Errorf("before the reboot, reboot_discarded_claims_total = %v, want 0", d)
	}

	start := time.Now()
	err := w.n.Reboot(w.ctx, func() error {
		// While the node is down: rb2 is deleted; it stays Terminating
		// until the kubelet is back.
		if err := w.cp.Client.CoreV1().Pods("default").Delete(w.ctx, "rb2", metav1.DeleteOptions{}); err != nil {
			return err
		}
		return os.WriteFile(bootFile, []byte(bootB), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node rebooted in %s", time.Since(start).Round(100*time.Millisecond))

	running := names[:2]
	poll.For(t, "rb0 and rb1 to run in new containers after the reboot", 5*time.Minute, func() (bool, string) {
		for _, name := range running {
			cs := w.pod(t, name).Status.ContainerStatuses
			if len(cs) != 1 || cs[0].ContainerID == ids[name] || cs[0].State.Running == nil {
				return false, fmt.Sprintf("%s: %+v", name, cs)
			}
		}
		return true, ""
	})
	t.Logf("pods running again %s after the reboot began", time.Since(start).Round(100*time.Millisecond))
	for _, name := range running {
		for _, tk := range w.waitTicks(t, name, 0) {
			if tk.devs != want[name] {
				t.Errorf("%s's container after the reboot sees %q at tick %d, want %q", name, tk.devs, tk.n, want[name])
			}
		}
	}
	poll.For(t, "rb2 to be gone", 2*time.Minute, func() (bool, string) {
		_, err := w.cp.Client.CoreV1().Pods("default").Get(w.ctx, "rb2", metav1.GetOptions{})
		return err != nil, fmt.Sprintf("%v", err)
	})
	// rb2's claim went with its pod: the driver holds exactly the others.
	poll.For(t, "the driver to hold exactly rb0's and rb1's claims", time.Minute, func() (bool, string) {
		cp := w.checkpoint(t)
		return len(cp.Claims) == 2, fmt.Sprintf("checkpoint claims %d, specs %v", len(cp.Claims), w.specFiles())
	})
	w.checkPrepared(t, uids[:2])

	driver := w.driverPod(t)
	if d := w.metric(t, driver, "rdma_dra_reboot_discarded_claims_total"); d != 3 {
		t.Errorf("reboot_discarded_claims_total = %v, want 3 (rb0, rb1, rb2 prepared before the reboot)", d)
	}
	var lines []string
	for _, l := range strings.Split(w.driverLog(false), "\n") {
		if strings.Contains(l, "The node rebooted") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "discarded=3") {
		t.Errorf("the driver's log has %d reboot lines, want one saying discarded=3:\n%s", len(lines), strings.Join(lines, "\n"))
	} else {
		t.Logf("the driver said: %s", lines[0])
	}
	if e := w.metric(t, driver, prepareErr); e != 0 {
		t.Logf("prepares refused after the reboot (the kubelet retries): %v", e)
	}
	t.Logf("prepares by the restarted driver: %v", w.metric(t, driver, prepareOK))

	// Nothing leaks once the pods go: reset waits for an empty checkpoint
	// and CDI dir.
	w.reset(t)
}
