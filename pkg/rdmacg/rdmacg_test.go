package rdmacg

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tree writes files (path -> content) under a new root.
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

const (
	cgroupsHeader = "#subsys_name\thierarchy\tnum_cgroups\tenabled\n"
	v1Mountinfo   = "30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n" +
		"31 30 0:27 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
		"32 30 0:28 / /sys/fs/cgroup/rdma rw,relatime - cgroup cgroup rw,rdma\n"
	v2Mountinfo = "30 25 0:26 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n"
)

func TestAvailable(t *testing.T) {
	tests := []struct {
		name, cgroups, want string
	}{
		{"enabled", cgroupsHeader + "memory\t4\t27\t1\nrdma\t9\t1\t1\n", ""},
		{"disabled", cgroupsHeader + "rdma\t0\t1\t0\n", "disabled"},
		{"not built", cgroupsHeader + "memory\t4\t27\t1\n", "CONFIG_CGROUP_RDMA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, why := FS{Root: tree(t, map[string]string{"proc/cgroups": tt.cgroups})}.Available()
			if ok != (tt.want == "") || !strings.Contains(why, tt.want) {
				t.Errorf("Available() = %v, %q; want reason containing %q", ok, why, tt.want)
			}
		})
	}
	if ok, why := (FS{Root: t.TempDir()}).Available(); ok || !strings.Contains(why, "/proc/cgroups") {
		t.Errorf("no /proc/cgroups: %v, %q", ok, why)
	}
}

func TestDir(t *testing.T) {
	tests := []struct {
		name    string
		files   map[string]string
		want    string // relative to the root
		wantErr string
	}{
		{
			name: "v1: the rdma hierarchy",
			files: map[string]string{
				"proc/42/cgroup":      "12:memory:/kubepods/pod1/c1\n9:rdma:/kubepods/pod1/c1\n0::/\n",
				"proc/self/mountinfo": v1Mountinfo,
			},
			want: "sys/fs/cgroup/rdma/kubepods/pod1/c1",
		},
		{
			name: "v1: rdma co-mounted with another controller",
			files: map[string]string{
				"proc/42/cgroup":      "9:pids,rdma:/k/c1\n",
				"proc/self/mountinfo": "40 30 0:28 / /sys/fs/cgroup/pids,rdma rw - cgroup cgroup rw,pids,rdma\n",
			},
			want: "sys/fs/cgroup/pids,rdma/k/c1",
		},
		{
			name: "v1: hierarchy not mounted",
			files: map[string]string{
				"proc/42/cgroup":      "9:rdma:/k/c1\n",
				"proc/self/mountinfo": "31 30 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
			},
			wantErr: "no cgroup v1 hierarchy with the rdma controller is mounted",
		},
		{
			name: "v1 without rdma (this machine's kernel)",
			files: map[string]string{
				"proc/42/cgroup":      "12:memory:/k/c1\n0::/\n",
				"proc/self/mountinfo": v1Mountinfo,
			},
			wantErr: "the process is in no cgroup with the rdma controller (nor the unified hierarchy: no cgroup2",
		},
		{
			name: "v2",
			files: map[string]string{
				"proc/42/cgroup":      "0::/kubepods.slice/cri-c1.scope\n",
				"proc/self/mountinfo": v2Mountinfo,
				"sys/fs/cgroup/kubepods.slice/cri-c1.scope/cgroup.controllers": "cpu memory pids rdma\n",
			},
			want: "sys/fs/cgroup/kubepods.slice/cri-c1.scope",
		},
		{
			name: "v2: controller not delegated",
			files: map[string]string{
				"proc/42/cgroup":                        "0::/k/c1\n",
				"proc/self/mountinfo":                   v2Mountinfo,
				"sys/fs/cgroup/k/c1/cgroup.controllers": "cpu memory pids\n",
			},
			wantErr: "the rdma controller is not enabled for this cgroup",
		},
		{
			name: "v2 mounted from a subtree (mountinfo root)",
			files: map[string]string{
				"proc/42/cgroup":                        "0::/outer/k/c1\n",
				"proc/self/mountinfo":                   "30 25 0:26 /outer /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
				"sys/fs/cgroup/k/c1/cgroup.controllers": "rdma\n",
			},
			want: "sys/fs/cgroup/k/c1",
		},
		{
			name: "cgroup outside the mounted subtree",
			files: map[string]string{
				"proc/42/cgroup":      "0::/elsewhere/c1\n",
				"proc/self/mountinfo": "30 25 0:26 /outer /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
			},
			wantErr: "outside the mounted part",
		},
		{
			name:    "process gone",
			files:   map[string]string{"proc/self/mountinfo": v2Mountinfo},
			wantErr: "proc/42/cgroup",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := tree(t, tt.files)
			got, err := FS{Root: root}.Dir(42)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Dir = %q, %v; want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(root, tt.want); got != want {
				t.Errorf("Dir = %s, want %s", got, want)
			}
		})
	}
}

func TestSetAndRead(t *testing.T) {
	dir := tree(t, map[string]string{"c/rdma.max": ""})
	cg := filepath.Join(dir, "c")
	l := Limit{Device: "rxe0", HCAHandle: 1, HCAObject: Unlimited}
	if err := Set(cg, l); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(cg, "rdma.max"))
	if string(b) != "rxe0 hca_handle=1 hca_object=max\n" {
		t.Errorf("rdma.max = %q", b)
	}
	got, err := Read(cg)
	if err != nil || got["rxe0"] != l {
		t.Errorf("Read = %+v, %v; want %+v", got, err, l)
	}

	for _, bad := range []Limit{{Device: "", HCAHandle: 1}, {Device: "a b", HCAHandle: 1}, {Device: "rxe0", HCAHandle: -2}} {
		if err := Set(cg, bad); err == nil {
			t.Errorf("Set(%+v) accepted", bad)
		}
	}
	if err := Set(filepath.Join(dir, "missing"), l); err == nil || !strings.Contains(err.Error(), "rdma.max") {
		t.Errorf("Set in a missing cgroup: %v", err)
	}
	os.WriteFile(filepath.Join(cg, "rdma.max"), []byte("rxe0 hca_handle=lots hca_object=max\n"), 0o644)
	if _, err := Read(cg); err == nil || !strings.Contains(err.Error(), `"lots"`) {
		t.Errorf("Read of a garbled rdma.max: %v", err)
	}
}

func TestParseValueAndString(t *testing.T) {
	for in, want := range map[string]int64{"max": Unlimited, "0": 0, "17": 17} {
		if got, err := ParseValue(in); err != nil || got != want {
			t.Errorf("ParseValue(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "-1", "MAX", "1.5"} {
		if _, err := ParseValue(in); err == nil {
			t.Errorf("ParseValue(%q) accepted", in)
		}
	}
	if got := unescape(`/a\040b`); got != "/a b" {
		t.Errorf("unescape = %q", got)
	}
}

func TestPodDir(t *testing.T) {
	for _, tt := range []struct {
		name, container, dir, uid, wantErr string
	}{
		{name: "cgroupfs", container: "/sys/fs/cgroup/kubepods/besteffort/pod0f3c-11/cri-1", dir: "/sys/fs/cgroup/kubepods/besteffort/pod0f3c-11", uid: "0f3c-11"},
		{name: "cgroupfs guaranteed", container: "/sys/fs/cgroup/kubepods/podabc/ctr", dir: "/sys/fs/cgroup/kubepods/podabc", uid: "abc"},
		{name: "systemd", container: "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f3c_11.slice/cri-containerd-1.scope",
			dir: "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f3c_11.slice", uid: "0f3c-11"},
		{name: "systemd guaranteed", container: "/sys/fs/cgroup/rdma/kubepods.slice/kubepods-pod9_a.slice/crio-2.scope", dir: "/sys/fs/cgroup/rdma/kubepods.slice/kubepods-pod9_a.slice", uid: "9-a"},
		{name: "not a pod", container: "/sys/fs/cgroup/vmtest/ctr", wantErr: "/sys/fs/cgroup/vmtest, the parent of the container's cgroup, is not a pod's cgroup"},
		{name: "the QoS level", container: "/sys/fs/cgroup/kubepods/besteffort/ctr", wantErr: "is not a pod's cgroup"},
		{name: "pod with nothing after", container: "/sys/fs/cgroup/kubepods/pod/ctr", wantErr: "is not a pod's cgroup"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir, uid, err := PodDir(tt.container)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("PodDir(%s) = %s, %s, %v; want an error containing %q", tt.container, dir, uid, err, tt.wantErr)
				}
				return
			}
			if err != nil || dir != tt.dir || uid != tt.uid {
				t.Errorf("PodDir(%s) = %s, %s, %v; want %s, %s", tt.container, dir, uid, err, tt.dir, tt.uid)
			}
		})
	}
}
