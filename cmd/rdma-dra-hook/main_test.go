package main

import (
	"github.com/rdma-dra/rdma-dra-driver/internal/hookbin"

	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmacg"
)

// node is a root with procfs and a cgroup v2 container cgroup for pid 42.
func node(t *testing.T) string {
	return tree(t, map[string]string{
		"proc/42/cgroup":                        "0::/k/c1\n",
		"proc/self/mountinfo":                   "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
		"sys/fs/cgroup/k/c1/cgroup.controllers": "memory rdma\n",
		"sys/fs/cgroup/k/c1/rdma.max":           "",
	})
}

// tree writes files (path -> content) under a new root and returns it.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestLimit(t *testing.T) {
	state := `{"ociVersion":"1.2.0","id":"ctr1","status":"creating","pid":42,"bundle":"/b"}`
	tests := []struct {
		name    string
		args    []string
		stdin   string
		want    string // rdma.max afterwards
		wantErr string
	}{
		{name: "handle limit", args: []string{"limit", "--device=rxe0", "--hca-handle=1"}, stdin: state, want: "rxe0 hca_handle=1 hca_object=max\n"},
		{name: "both", args: []string{"limit", "--device=mlx5_0", "--hca-handle=4", "--hca-object=1000"}, stdin: state, want: "mlx5_0 hca_handle=4 hca_object=1000\n"},
		{name: "no command", args: nil, wantErr: "usage"},
		{name: "unknown command", args: []string{"move"}, wantErr: `unknown command "move"`},
		{name: "bad value", args: []string{"limit", "--device=rxe0", "--hca-handle=lots"}, stdin: state, wantErr: `--hca-handle: "lots"`},
		{name: "unknown flag", args: []string{"limit", "--device=rxe0", "--handles=1"}, stdin: state, wantErr: "flag provided but not defined"},
		{name: "no device", args: []string{"limit", "--hca-handle=1"}, stdin: state, wantErr: `RDMA device name ""`},
		{name: "not a hook", args: []string{"limit", "--device=rxe0", "--hca-handle=1"}, stdin: "", wantErr: "HCA rxe0"},
		{name: "no process", args: []string{"limit", "--device=rxe0", "--hca-handle=1"}, stdin: `{"id":"c","pid":0}`, wantErr: "has no process"},
		{name: "process gone", args: []string{"limit", "--device=rxe0", "--hca-handle=1"}, stdin: `{"id":"c","pid":7}`, wantErr: "HCA rxe0: cannot set rdma.max (rxe0 hca_handle=1 hca_object=max) of container c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := node(t)
			err := run(tt.args, strings.NewReader(tt.stdin), deps{fs: rdmacg.FS{Root: root}})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(filepath.Join(root, "sys/fs/cgroup/k/c1/rdma.max"))
			if string(b) != tt.want {
				t.Errorf("rdma.max = %q, want %q", b, tt.want)
			}
		})
	}
}

func TestInstall(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "self")
	if err := os.WriteFile(src, []byte("\x7fELF hook"), 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "host", "opt", "bin")
	self := func() (string, error) { return src, nil }
	for range 2 { // a reinstall replaces the files
		if err := install([]string{dst}, self); err != nil {
			t.Fatal(err)
		}
	}
	// An older release's hook, pinned before: the new install keeps it.
	old := filepath.Join(dst, hookbin.Pinned([]byte("old hook")))
	if err := os.WriteFile(old, []byte("old hook"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := install([]string{dst}, self); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rdma-dra-hook", hookbin.Pinned([]byte("\x7fELF hook"))} {
		fi, err := os.Stat(filepath.Join(dst, name))
		if err != nil || fi.Mode().Perm() != 0o755 || fi.Size() != 9 {
			t.Fatalf("installed hook %s: %v, %v", name, fi, err)
		}
	}
	if b, err := os.ReadFile(old); err != nil || string(b) != "old hook" {
		t.Errorf("the older release's pinned hook after an install: %q, %v", b, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dst, "*")); len(left) != 3 {
		t.Errorf("install left %v, want the plain hook, its pinned copy and the older pinned hook", left)
	}
	for _, args := range [][]string{nil, {"relative/dir"}, {"/a", "relative/cdi"}, {"/a", "/b", "/c"}} {
		if err := install(args, self); err == nil || !strings.Contains(err.Error(), "absolute directory") {
			t.Errorf("install(%q) = %v", args, err)
		}
	}
}

// TestInstallPrunes: with the CDI spec directory, install removes the
// pinned hooks that no spec names, once an hour old, and nothing else.
func TestInstallPrunes(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "self")
	if err := os.WriteFile(src, []byte("\x7fELF hook v3"), 0o755); err != nil {
		t.Fatal(err)
	}
	self := func() (string, error) { return src, nil }
	hooks, cdi := filepath.Join(dir, "hooks"), filepath.Join(dir, "cdi")
	for _, d := range []string{hooks, cdi} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	current := hookbin.Pinned([]byte("\x7fELF hook v3"))
	old := time.Now().Add(-2 * pruneMinAge)
	hook := func(content string, modified time.Time) string {
		name := hookbin.Pinned([]byte(content))
		p := filepath.Join(hooks, name)
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, modified, modified); err != nil {
			t.Fatal(err)
		}
		return name
	}
	named := hook("hook v2, named by a spec", old)
	unused := hook("hook v1, named by no spec", old)
	recent := hook("hook of a release installing now", time.Now())
	other := filepath.Join(hooks, "not-a-hook-0123456789abcdef")
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(other, old, old); err != nil {
		t.Fatal(err)
	}
	spec := `{"cdiVersion":"0.8.0","kind":"rdma.dra.dev/hca","containerEdits":{"hooks":[{"hookName":"createContainer","path":"/opt/rdma-dra-driver/bin/` + named + `"}]}}`
	if err := os.WriteFile(filepath.Join(cdi, "rdma.dra.dev-claim_x.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}

	if err := install([]string{hooks, cdi}, self); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		want bool
	}{
		{hookbin.Name, true},
		{current, true},
		{named, true},
		{recent, true},
		{filepath.Base(other), true},
		{unused, false},
	} {
		_, err := os.Stat(filepath.Join(hooks, tt.name))
		if got := err == nil; got != tt.want {
			t.Errorf("%s present after install: %v, want %v (%v)", tt.name, got, tt.want, err)
		}
	}

	// An unreadable CDI directory prunes nothing.
	unused = hook("hook v0, named by no spec", old)
	if err := install([]string{hooks, filepath.Join(dir, "absent")}, self); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(hooks, unused)); err != nil {
		t.Errorf("install without a readable CDI directory removed %s: %v", unused, err)
	}
}
