package main

import (
	"github.com/rdma-dra/rdma-dra-driver/internal/hookbin"

	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmacg"
)

// node is a root with procfs and a cgroup v2 container cgroup for pid 42.
func node(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range map[string]string{
		"proc/42/cgroup":                        "0::/k/c1\n",
		"proc/self/mountinfo":                   "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
		"sys/fs/cgroup/k/c1/cgroup.controllers": "memory rdma\n",
		"sys/fs/cgroup/k/c1/rdma.max":           "",
	} {
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
	for _, args := range [][]string{nil, {"relative/dir"}, {"/a", "/b"}} {
		if err := install(args, self); err == nil || !strings.Contains(err.Error(), "absolute directory") {
			t.Errorf("install(%q) = %v", args, err)
		}
	}
}
