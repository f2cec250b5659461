package vm

// TestVM boots Debian's kernel once with Soft-RoCE (and soft-iWARP when it
// builds) and runs the guest scenarios (./guest, built with go test -c) in
// it; each guest test shows up here as a subtest with its output.
//
// Environment: RDMA_DRA_VM=0 skips; RDMA_DRA_VM_RUN is the guest's -run;
// RDMA_DRA_VM_ACCEL=tcg|kvm|auto (auto: KVM only if a probe boot works);
// RDMA_DRA_VM_SIW=0 leaves siw out; RDMA_DRA_VM_SHELL runs a shell command
// in the guest instead of the tests (for looking around).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// bootTimeout bounds one VM run: boot (~15 s), the scenarios, power-off.
const bootTimeout = 9 * time.Minute

func TestVM(t *testing.T) {
	t.Parallel() // beside TestVMFailuresNameTheCause, after TestVMNode
	cache := requireVM(t)
	cacheDir := cache.Dir
	ctx := context.Background()
	dir := t.TempDir()

	start := time.Now()
	prog, args := "/guest/guest.test", []string{"-test.v", "-test.count=1", "-test.timeout=8m"}
	if r := os.Getenv("RDMA_DRA_VM_RUN"); r != "" {
		args = append(args, "-test.run="+r)
	}
	files, err := productBinaries(dir)
	if err != nil {
		t.Fatal(err)
	}
	shell := os.Getenv("RDMA_DRA_VM_SHELL")
	if shell != "" {
		prog, args = "/bin/sh", []string{"-c", shell}
	} else {
		bin := filepath.Join(dir, "guest.test")
		cmd := exec.Command("go", "test", "-c", "-o", bin, "./guest")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building the guest tests (go test -c ./guest): %v\n%s", err, out)
		}
		files = append(files, GuestFile{Path: prog, Src: bin})
	}
	built := time.Now()
	withSiw := os.Getenv("RDMA_DRA_VM_SIW") != "0"
	im, err := cache.Build(ctx, dir, ImageSpec{Files: files, Prog: prog, Args: args, Env: []string{"RDMA_DRA_VM_GUEST=1",
		"RDMA_DRA_VM_HOOK=" + GuestHookPath, "RDMA_DRA_VM_RDMACTL=" + GuestRdmactl, "RDMA_DRA_VM_RDMANL_TEST=" + GuestRdmanlTest}, Siw: withSiw})
	if err != nil {
		t.Fatalf("building the VM image: %v", err)
	}
	if !im.Siw {
		t.Logf("siw: %s", im.SiwSkipped)
	}
	imaged := time.Now()

	accel := chooseAccel(ctx, t, cacheDir, im)
	t.Logf("kernel %s (%s), %s; guest build %v, image %v", im.Release, im.KernelVer, accel,
		built.Sub(start).Round(time.Millisecond), imaged.Sub(built).Round(time.Millisecond))

	boot := &Boot{Image: im, Dir: dir, Accel: accel, Timeout: bootTimeout,
		Console: func(l string) { t.Logf("console| %s", l) },
		Output: func(l string) {
			if shell != "" || strings.HasPrefix(l, "=== RUN") || endLine.MatchString(l) {
				t.Logf("guest| %s", l)
			}
		},
	}
	res, err := boot.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VM ran %v (total with builds %v), guest exit code %d", res.Elapsed.Round(time.Millisecond),
		time.Since(start).Round(time.Millisecond), res.ExitCode)
	if shell != "" {
		if res.ExitCode != 0 {
			t.Errorf("guest shell exited %d", res.ExitCode)
		}
		return
	}
	reportGuestTests(t, res)
}

// requireVM skips where no VM can run, saying why, and returns the
// package cache (made if missing: whichever test runs first).
func requireVM(t *testing.T) *Cache {
	t.Helper()
	if os.Getenv("RDMA_DRA_VM") == "0" {
		t.Skip("the environment sets RDMA_DRA_VM=0: the VM suite is switched off on this machine")
	}
	if ok, why := Available(); !ok {
		t.Skip("no VM on this machine: " + why)
	}
	dir, err := DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &Cache{Dir: dir, Log: t.Logf}
}

// Guest paths of the product's binaries: the hook (where the guest's driver
// names it in CDI specs), rdmactl, and pkg/rdmanl's tests, which talk to
// the kernel's RDMA netlink.
const (
	GuestHookPath   = "/usr/bin/rdma-dra-hook"
	GuestRdmactl    = "/usr/bin/rdmactl"
	GuestRdmanlTest = "/guest/rdmanl.test"
)

// productBinaries builds, statically (CGO_ENABLED=0), the main module's
// binaries the guest scenarios run.
func productBinaries(dir string) ([]GuestFile, error) {
	root, err := filepath.Abs("../..") // the main module, from test/vm
	if err != nil {
		return nil, err
	}
	var files []GuestFile
	for _, b := range []struct {
		guest, name string
		args        []string
	}{
		{GuestHookPath, "rdma-dra-hook", []string{"build", "-o", "", "./cmd/rdma-dra-hook"}},
		{GuestRdmactl, "rdmactl", []string{"build", "-o", "", "./cmd/rdmactl"}},
		{GuestRdmanlTest, "rdmanl.test", []string{"test", "-c", "-o", "", "./pkg/rdmanl"}},
	} {
		out := filepath.Join(dir, b.name)
		args := append([]string{}, b.args...)
		for i, a := range args {
			if a == "" && i > 0 && args[i-1] == "-o" {
				args[i] = out
			}
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s (go %s in %s): %v\n%s", b.name, strings.Join(args, " "), root, err, msg)
		}
		files = append(files, GuestFile{Path: b.guest, Src: out})
	}
	return files, nil
}

// reportGuestTests turns each guest test into a subtest with its output,
// failing where the guest's failed, never finished, or the binary failed.
func reportGuestTests(t *testing.T, res *Result) {
	t.Helper()
	tests, rest := ParseTestOutput(res.Output)
	failed := false
	for _, g := range tests {
		t.Run(g.Name, func(t *testing.T) {
			t.Log("guest output:\n" + strings.Join(g.Output, "\n"))
			switch g.Status {
			case "FAIL":
				failed = true
				t.Fail()
			case "SKIP":
				t.Skip("skipped in the guest: " + skipReason(g.Output))
			case "":
				failed = true
				t.Errorf("%s never finished in the guest; guest output after it:\n%s", g.Name, strings.Join(rest, "\n"))
			}
		})
	}
	if len(tests) == 0 {
		t.Errorf("the guest ran no tests:\n%s", strings.Join(res.Output, "\n"))
	}
	if res.ExitCode != 0 && !failed {
		t.Errorf("guest test binary exited %d:\n%s", res.ExitCode, strings.Join(rest, "\n"))
	}
}

// skipReason is the guest's own skip line (its last output line before
// the "--- SKIP" verdict), which names what the guest lacked.
func skipReason(output []string) string {
	for i := len(output) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(output[i]); l != "" && !strings.HasPrefix(l, "--- SKIP") {
			return l
		}
	}
	return "the guest gave no reason"
}

// chooseAccel follows RDMA_DRA_VM_ACCEL=tcg|kvm|auto (auto, the default:
// KVM only if a probe boot works).
func chooseAccel(ctx context.Context, t *testing.T, cacheDir string, im *Image) string {
	t.Helper()
	accel := os.Getenv("RDMA_DRA_VM_ACCEL")
	switch accel {
	case "", "auto":
		accel = "tcg"
		if ok, why := ProbeKVM(ctx, cacheDir, im.Kernel); ok {
			accel = "kvm"
		} else {
			t.Logf("KVM not used: %s", firstLine(why))
		}
	case "kvm", "tcg":
	default:
		t.Fatalf("RDMA_DRA_VM_ACCEL=%q: want tcg, kvm or auto", accel)
	}
	return accel
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
