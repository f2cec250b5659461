package main

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// runcWithHook runs busybox's `cat /proc/self/limits` in a runc container
// whose createRuntime hook is this package's memlock with bytes, and whose
// spec asks for specMemlock (0: none). It returns the container's output
// and runc's error.
func runcWithHook(t *testing.T, hookBin, bytesArg string, specMemlock uint64) (string, error) {
	t.Helper()
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	for _, d := range []string{"bin", "proc", "dev", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs"},
		Process: &specs.Process{Args: []string{"/bin/busybox", "cat", "/proc/self/limits"}, Cwd: "/", NoNewPrivileges: true,
			User: specs.User{UID: 65534, GID: 65534}},
		Mounts: []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Hooks: &specs.Hooks{CreateRuntime: []specs.Hook{{Path: hookBin,
			Args: []string{"rdma-dra-hook", "memlock", "--device=rxe0", "--bytes=" + bytesArg}}}},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace}}},
	}
	if specMemlock > 0 {
		spec.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_MEMLOCK", Hard: specMemlock, Soft: specMemlock}}
	}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := fmt.Sprintf("memlock-%d", time.Now().UnixNano())
	cmd := exec.CommandContext(ctx, "runc", "--root", filepath.Join(bundle, "runc-root"), "run", "--bundle", bundle, id)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	return out.String(), err
}

var lockedRE = regexp.MustCompile(`Max locked memory\s+(\S+)\s+(\S+)`)

// TestMemlockUnderRunc: the limit the hook sets at createRuntime is what
// the container's process (as nobody, no capabilities) runs with, under a
// real runc; a runtime's own RLIMIT_MEMLOCK in the spec, which runc
// applies after the hooks, is left alone; and a hook
// that cannot set its limit stops the container (fail closed), with its
// message in runc's error.
func TestMemlockUnderRunc(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run runc containers")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc is not installed (apt-get install runc)")
	}
	if f, err := elf.Open("/bin/busybox"); err != nil {
		t.Skipf("no /bin/busybox: %v (apt-get install busybox-static)", err)
	} else {
		interp := f.Section(".interp")
		f.Close()
		if interp != nil {
			t.Skip("/bin/busybox is dynamically linked; the container needs busybox-static")
		}
	}
	hookBin := filepath.Join(t.TempDir(), "rdma-dra-hook")
	if out, err := exec.Command("go", "build", "-o", hookBin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building the hook: %v\n%s", err, out)
	}

	for _, tt := range []struct {
		name        string
		bytes       string
		specMemlock uint64
		want        string
	}{
		{"no runtime setting", "4Mi", 0, "4194304 4194304"},
		// runc applies the spec's rlimits after the createRuntime hooks:
		// the hook leaves a runtime's own setting alone.
		{"the runtime's own setting stands", "2Mi", 6 << 20, "6291456 6291456"},
	} {
		out, err := runcWithHook(t, hookBin, tt.bytes, tt.specMemlock)
		if err != nil {
			t.Fatalf("%s: runc: %v\n%s", tt.name, err, out)
		}
		m := lockedRE.FindStringSubmatch(out)
		if m == nil || m[1]+" "+m[2] != tt.want {
			t.Errorf("%s: the container's memlock limit %v, want %s\n%s", tt.name, m, tt.want, out)
		}
	}

	if hasCapSysResource() {
		out, err := runcWithHook(t, hookBin, "unlimited", 0)
		if err != nil || !strings.Contains(out, "unlimited") {
			t.Errorf("with CAP_SYS_RESOURCE, unlimited: %v\n%s", err, out)
		}
		return
	}
	out, err := runcWithHook(t, hookBin, "unlimited", 0)
	if err == nil || strings.Contains(out, "Max locked memory") {
		t.Fatalf("the hook could not raise the hard limit here, yet the container ran: %v\n%s", err, out)
	}
	if !strings.Contains(out, "HCA rxe0: cannot set the memlock limit") || !strings.Contains(out, "needs CAP_SYS_RESOURCE") {
		t.Errorf("runc's error does not carry the hook's refusal:\n%s", out)
	}
	t.Logf("without CAP_SYS_RESOURCE the container is refused: %s", strings.TrimSpace(lastLine(out)))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
