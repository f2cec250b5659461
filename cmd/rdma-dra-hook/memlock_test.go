package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseMemlock(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{"unlimited", unix.RLIM_INFINITY, false}, {"max", unix.RLIM_INFINITY, false},
		{"268435456", 256 << 20, false}, {"256Mi", 256 << 20, false}, {"256M", 256 << 20, false},
		{"64Ki", 64 << 10, false}, {"2G", 2 << 30, false},
		{"0", 0, true}, {"-1", 0, true}, {"Mi", 0, true}, {"1.5G", 0, true}, {"1T", 0, true}, {"99999999999999999999", 0, true},
		{"17179869184Gi", 0, true},
	} {
		got, err := parseMemlock(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseMemlock(%q) = %d, %v; want %d, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// fakeRlimit is a process's RLIMIT_MEMLOCK as the kernel keeps it: an
// unprivileged caller may lower both limits and raise the soft one up to
// the hard one.
type fakeRlimit struct {
	cur, max   uint64
	privileged bool
	sets       int
}

func (f *fakeRlimit) prlimit(_ int, new, old *unix.Rlimit) error {
	if old != nil {
		old.Cur, old.Max = f.cur, f.max
	}
	if new == nil {
		return nil
	}
	if new.Max > f.max && !f.privileged {
		return unix.EPERM
	}
	f.cur, f.max = new.Cur, new.Max
	f.sets++
	return nil
}

const ociState = `{"ociVersion":"1.2.0","id":"abc","status":"creating","pid":4242,"bundle":"/b",
 "annotations":{"io.kubernetes.cri.container-name":"trainer","io.kubernetes.cri.sandbox-namespace":"ml","io.kubernetes.cri.sandbox-name":"job-0"}}`

func TestMemlock(t *testing.T) {
	const eight = 8 << 20
	tests := []struct {
		name     string
		args     []string
		limit    fakeRlimit
		wantCur  uint64
		wantSets int
		wantErr  []string
	}{
		{name: "unlimited by default, privileged hook", args: []string{"--device=mlx5_0"}, limit: fakeRlimit{cur: eight, max: eight, privileged: true},
			wantCur: unix.RLIM_INFINITY, wantSets: 1},
		{name: "the class's value", args: []string{"--device=mlx5_0", "--bytes=256Mi"}, limit: fakeRlimit{cur: eight, max: eight, privileged: true},
			wantCur: 256 << 20, wantSets: 1},
		{name: "already set: nothing to do", args: []string{"--device=mlx5_0", "--bytes=8Mi"}, limit: fakeRlimit{cur: eight, max: eight},
			wantCur: eight},
		{name: "lower without privilege", args: []string{"--device=mlx5_0", "--bytes=4Mi"}, limit: fakeRlimit{cur: eight, max: eight},
			wantCur: 4 << 20, wantSets: 1},
		{name: "raise past the hard limit without CAP_SYS_RESOURCE: refused, fail closed", args: []string{"--device=mlx5_0", "--device=mlx5_1"},
			limit: fakeRlimit{cur: eight, max: eight}, wantCur: eight,
			wantErr: []string{"HCAs mlx5_0, mlx5_1", "container trainer of pod ml/job-0", "to unlimited", "raising the hard limit from 8388608 needs CAP_SYS_RESOURCE", "CAP_IPC_LOCK"}},
		{name: "no device", args: []string{"--bytes=1Mi"}, limit: fakeRlimit{cur: eight, max: eight}, wantCur: eight, wantErr: []string{"want at least one --device"}},
		{name: "bad bytes", args: []string{"--device=mlx5_0", "--bytes=lots"}, limit: fakeRlimit{cur: eight, max: eight}, wantCur: eight, wantErr: []string{`--bytes: "lots"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rl := tt.limit
			err := run(append([]string{"memlock"}, tt.args...), strings.NewReader(ociState), deps{rlimit: &rl})
			if len(tt.wantErr) == 0 && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			for _, w := range tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want it to say %q", err, w)
				}
			}
			if rl.cur != tt.wantCur || rl.max != tt.wantCur || rl.sets != tt.wantSets {
				t.Errorf("limit %d/%d after %d sets, want %d/%d after %d", rl.cur, rl.max, rl.sets, tt.wantCur, tt.wantCur, tt.wantSets)
			}
		})
	}
}

// hasCapSysResource reports whether this process may raise a hard rlimit.
func hasCapSysResource() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<unix.CAP_SYS_RESOURCE) != 0
}

// TestMemlockRealProcess runs the hook's prlimit on a real child process:
// it lowers the limit and reads it back; asked to go past the hard limit,
// it either raises it (a hook with CAP_SYS_RESOURCE, as on a normal node)
// or, where the capability is missing (this development machine's bounding
// set lacks it), refuses, naming why, and leaves the limit as it was.
func TestMemlockRealProcess(t *testing.T) {
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	pid := child.Process.Pid
	state := fmt.Sprintf(`{"ociVersion":"1.2.0","id":"real","status":"creating","pid":%d,"bundle":"/b"}`, pid)
	read := func() unix.Rlimit {
		var r unix.Rlimit
		if err := unix.Prlimit(pid, unix.RLIMIT_MEMLOCK, nil, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	hook := func(bytes string) error {
		return run([]string{"memlock", "--device=rxe0", "--bytes=" + bytes}, strings.NewReader(state), deps{rlimit: sysPrlimit{}})
	}
	start := read()
	if start.Max != unix.RLIM_INFINITY && start.Max < 2<<20 {
		t.Fatalf("the child's hard memlock limit is %d, below the 2 MiB this test lowers it to", start.Max)
	}
	if err := hook("2Mi"); err != nil {
		t.Fatalf("lowering to 2 MiB: %v", err)
	}
	if r := read(); r.Cur != 2<<20 || r.Max != 2<<20 {
		t.Fatalf("after the hook: %d/%d, want 2097152/2097152", r.Cur, r.Max)
	}
	err := hook("unlimited")
	if hasCapSysResource() {
		t.Logf("this process has CAP_SYS_RESOURCE: the hook raises the hard limit")
		if err != nil {
			t.Fatalf("raising to unlimited with CAP_SYS_RESOURCE: %v", err)
		}
		if r := read(); r.Cur != unix.RLIM_INFINITY || r.Max != unix.RLIM_INFINITY {
			t.Errorf("after raising: %d/%d, want unlimited", r.Cur, r.Max)
		}
		return
	}
	t.Logf("this process lacks CAP_SYS_RESOURCE (uid %d): the hook must refuse to raise the hard limit", os.Getuid())
	if err == nil || !strings.Contains(err.Error(), "needs CAP_SYS_RESOURCE") {
		t.Fatalf("raising past the hard limit without CAP_SYS_RESOURCE: %v, want a refusal naming CAP_SYS_RESOURCE", err)
	}
	if !strings.Contains(err.Error(), "HCA rxe0") || !strings.Contains(err.Error(), "container real") {
		t.Errorf("refusal %q does not name the HCA and the container", err)
	}
	if r := read(); r.Cur != 2<<20 || r.Max != 2<<20 {
		t.Errorf("after the refusal: %d/%d, want the limit unchanged (2097152)", r.Cur, r.Max)
	}
}

// TestMemlockRuntimeSetting: a spec that sets RLIMIT_MEMLOCK is the
// runtime's choice, applied after the hook: left alone, and said; a
// garbled spec stops the container, naming the file.
func TestMemlockRuntimeSetting(t *testing.T) {
	bundle := t.TempDir()
	state := fmt.Sprintf(`{"id":"c1","pid":4242,"bundle":%q}`, bundle)
	write := func(s string) {
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"process":{"rlimits":[{"type":"RLIMIT_NOFILE","hard":1024,"soft":1024},{"type":"RLIMIT_MEMLOCK","hard":65536,"soft":65536}]}}`)
	rl := fakeRlimit{cur: 8 << 20, max: 8 << 20, privileged: true}
	var log strings.Builder
	if err := run([]string{"memlock", "--device=mlx5_0"}, strings.NewReader(state), deps{rlimit: &rl, log: &log}); err != nil {
		t.Fatal(err)
	}
	if rl.sets != 0 || !strings.Contains(log.String(), "the runtime sets RLIMIT_MEMLOCK 65536 itself") {
		t.Errorf("sets %d, log %q: want the runtime's setting left alone and said", rl.sets, log.String())
	}
	write(`{"process":{"rlimits":[{"type":"RLIMIT_NOFILE","hard":1024,"soft":1024}]}}`)
	if err := run([]string{"memlock", "--device=mlx5_0"}, strings.NewReader(state), deps{rlimit: &rl}); err != nil || rl.sets != 1 {
		t.Errorf("a spec without memlock: %v, %d sets; want the hook's limit", err, rl.sets)
	}
	write(`{"process":`)
	err := run([]string{"memlock", "--device=mlx5_0"}, strings.NewReader(state), deps{rlimit: &rl})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(bundle, "config.json")) || !strings.Contains(err.Error(), "HCA mlx5_0") {
		t.Errorf("a garbled spec: %v, want an error naming the file and the HCA", err)
	}
}
