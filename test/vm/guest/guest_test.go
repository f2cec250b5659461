// Package guest holds the scenarios that run inside the VM (test/vm boots
// it): a real kernel with Soft-RoCE devices rxe0 (on eth0, 10.0.2.15) and
// rxe1 (on eth1, 10.0.3.15), and soft-iWARP siw0 (on eth0) when it was
// built. Outside the VM every test skips.
package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// inGuest skips unless the test runs in the VM.
func inGuest(t *testing.T) {
	t.Helper()
	if os.Getenv("RDMA_DRA_VM_GUEST") != "1" {
		t.Skip("not in the test/vm guest (RDMA_DRA_VM_GUEST=1 is missing from the environment): these tests need its Soft-RoCE kernel")
	}
}

// siwBuilt says whether siw0 exists; otherwise the reason the host gave.
func siwBuilt() (bool, string) {
	if os.Getenv("RDMA_DRA_VM_SIW") == "1" {
		return true, ""
	}
	why := os.Getenv("RDMA_DRA_VM_SIW_SKIP")
	if why == "" {
		why = "siw was not built"
	}
	return false, why
}

// rdmaDevices are the devices /init created.
func rdmaDevices() []string {
	if ok, _ := siwBuilt(); ok {
		return []string{"rxe0", "rxe1", "siw0"}
	}
	return []string{"rxe0", "rxe1"}
}

// command runs a tool of the guest and returns its stdout; a failure is
// fatal and shows stderr.
func command(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out
}

// rdmaJSON runs `rdma -j <args>` and decodes its answer.
func rdmaJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := command(t, "rdma", append([]string{"-j"}, args...)...)
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("rdma -j %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// setLink runs ip link set <dev> up|down.
func setLink(t *testing.T, dev, state string) {
	t.Helper()
	command(t, "ip", "link", "set", dev, state)
}

func readTrim(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}
