package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestMakeBuildStampsVersion builds the binaries as a release is built
// (make build) and runs their version commands: each names the VERSION
// file's version, the commit git has checked out, and the Go version.
func TestMakeBuildStampsVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: make build links every command (tens of seconds)")
	}
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: %v", tool, err)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout (%v): the commit cannot be compared", err)
	}
	b, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSpace(string(b))
	bin := t.TempDir()
	if out, err := exec.Command("make", "-s", "-C", root, "build", "BIN="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	for _, cmd := range [][]string{{"rdma-dra-driver", "--version"}, {"rdmactl", "version"}} {
		out, err := exec.Command(filepath.Join(bin, cmd[0]), cmd[1:]...).Output()
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(cmd, " "), err)
		}
		got := strings.TrimSpace(string(out))
		// The tree may have uncommitted changes: then the commit says -dirty.
		prefix := cmd[0] + " " + want + " (commit " + strings.TrimSpace(string(head))
		if !strings.HasPrefix(got, prefix) || !strings.HasSuffix(got, ", "+runtime.Version()+")") {
			t.Errorf("%s printed %q, want %q[-dirty], %s)", strings.Join(cmd, " "), got, prefix, runtime.Version())
		}
	}
}
