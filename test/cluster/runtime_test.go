package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

// runtimeEnv is a rootfs and a runc root shared by one test's containers.
type runtimeEnv struct {
	dir    string
	rootfs string
	state  string
	n      atomic.Int32
}

func newRuntimeEnv(t *testing.T) *runtimeEnv {
	t.Helper()
	if ok, why := RuntimeAvailable(); !ok {
		t.Skip("runc containers unavailable: " + why)
	}
	dir := t.TempDir()
	rootfs, err := Rootfs(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := &runtimeEnv{dir: dir, rootfs: rootfs, state: filepath.Join(dir, "state")}
	t.Cleanup(func() {
		if ids := runcList(t, e.state); len(ids) > 0 {
			t.Errorf("runc state left behind: %v", ids)
		}
	})
	return e
}

// run runs spec in a new container and fails the test if runc could not.
func (e *runtimeEnv) run(t *testing.T, spec *specs.Spec) (int, string) {
	t.Helper()
	id := fmt.Sprintf("c%d", e.n.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, err := RunContainer(ctx, e.state, filepath.Join(e.dir, id), id, spec)
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", id, spec.Process.Args, err, out)
	}
	return code, string(out)
}

func (e *runtimeEnv) sh(t *testing.T, script string, addCaps ...string) (int, string) {
	t.Helper()
	return e.run(t, ContainerSpec(e.rootfs, []string{"sh", "-c", script}, nil, addCaps, false))
}

// runcList returns the containers runc knows in root.
func runcList(t *testing.T, root string) []string {
	t.Helper()
	out, err := exec.Command("runc", "--root", root, "list", "-q").CombinedOutput()
	if err != nil {
		t.Fatalf("runc list: %v: %s", err, out)
	}
	return strings.Fields(string(out))
}

func TestRuntimeEcho(t *testing.T) {
	e := newRuntimeEnv(t)
	code, out := e.run(t, ContainerSpec(e.rootfs, []string{"echo", "hello"}, nil, nil, false))
	if code != 0 || out != "hello\n" {
		t.Errorf("echo hello: exit %d, output %q; want 0, %q", code, out, "hello\n")
	}
}

func TestRuntimeExitCode(t *testing.T) {
	e := newRuntimeEnv(t)
	// stdout comes first, whatever the order of writes.
	code, out := e.sh(t, "echo err >&2; echo out; exit 3")
	if code != 3 || out != "out\nerr\n" {
		t.Errorf("exit 3: exit %d, output %q; want 3, %q", code, out, "out\nerr\n")
	}
}

func TestRuntimeEnvAndNetwork(t *testing.T) {
	e := newRuntimeEnv(t)
	spec := ContainerSpec(e.rootfs, []string{"sh", "-c", "env | sort; ls /sys/class/net | sort | tr '\\n' ' '"},
		[]string{"A=1", "PATH=/bin"}, nil, false)
	_, out := e.run(t, spec)
	want := "A=1\nHOME=/\nPATH=/bin\nPWD=/\nSHLVL=1\nlo "
	if out != want {
		t.Errorf("env and netdevs:\n%s\nwant:\n%s", out, want)
	}
	host, err := os.ReadDir("/sys/class/net")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range host {
		names = append(names, d.Name())
	}
	slices.Sort(names)
	_, out = e.run(t, ContainerSpec(e.rootfs, []string{"sh", "-c", "ls /sys/class/net | sort | tr '\\n' ' '"}, nil, nil, true))
	if want := strings.Join(names, " ") + " "; out != want {
		t.Errorf("hostNetwork netdevs: %q, want the host's %q", out, want)
	}
}

// TestRuntimeFilesystem checks what lets containers share one Rootfs: a
// read-only root, and a private tmpfs on /tmp and /dev/shm.
func TestRuntimeFilesystem(t *testing.T) {
	e := newRuntimeEnv(t)
	const script = `touch /f 2>&1 | grep -o 'Read-only file system'
for d in /tmp /dev/shm; do
	grep " $d tmpfs " /proc/mounts | grep -c rw,
	test -e $d/f && echo shared; echo "$0" > $d/f
done`
	var wg sync.WaitGroup
	outs := make([]string, 4)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("fs%d", i)
			spec := ContainerSpec(e.rootfs, []string{"sh", "-c", script, id}, nil, nil, false)
			code, out, err := RunContainer(context.Background(), e.state, filepath.Join(e.dir, id), id, spec)
			outs[i] = fmt.Sprintf("exit %d, err %v: %s", code, err, out)
		}()
	}
	wg.Wait()
	for _, out := range outs {
		if want := "exit 0, err <nil>: Read-only file system\n1\n1\n"; out != want {
			t.Errorf("%q, want %q", out, want)
		}
	}
}

func TestRuntimeStartFailure(t *testing.T) {
	e := newRuntimeEnv(t)
	spec := ContainerSpec(e.rootfs, []string{"no-such-command"}, nil, nil, false)
	_, out, err := RunContainer(context.Background(), e.state, filepath.Join(e.dir, "bad"), "bad", spec)
	if err == nil || !strings.Contains(err.Error(), "no-such-command") {
		t.Errorf("a missing command: err %v, want runc's start error naming it (output %q)", err, out)
	}
}

// capEff runs a container with addCaps and returns its effective set.
func (e *runtimeEnv) capEff(t *testing.T, addCaps ...string) uint64 {
	t.Helper()
	code, out := e.sh(t, "cat /proc/self/status", addCaps...)
	if code != 0 {
		t.Fatalf("cat /proc/self/status: exit %d: %s", code, out)
	}
	m, err := ParseCapMask(out, "CapEff")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestRuntimeCapabilities(t *testing.T) {
	e := newRuntimeEnv(t)
	const ipcLock, sysResource = 14, 24
	if CapBit("IPC_LOCK") != ipcLock || CapBit("CAP_SYS_RESOURCE") != sysResource || CapBit("NOPE") != -1 {
		t.Fatalf("CapBit: IPC_LOCK %d, SYS_RESOURCE %d, NOPE %d", CapBit("IPC_LOCK"), CapBit("CAP_SYS_RESOURCE"), CapBit("NOPE"))
	}
	has := func(m uint64, bit int) bool { return m&(1<<bit) != 0 }

	// runc's defaults: AUDIT_WRITE, KILL, NET_BIND_SERVICE.
	if m := e.capEff(t); m != 1<<29|1<<5|1<<10 {
		t.Errorf("default CapEff %016x, want runc's %016x", m, uint64(1<<29|1<<5|1<<10))
	}
	if m := e.capEff(t, "IPC_LOCK"); !has(m, ipcLock) || has(m, sysResource) {
		t.Errorf("IPC_LOCK added: CapEff %016x", m)
	}

	t.Run("SYS_RESOURCE", func(t *testing.T) {
		if bad := UnavailableCaps("CAP_SYS_RESOURCE"); len(bad) > 0 {
			// RunContainer refuses it instead of letting runc fail.
			spec := ContainerSpec(e.rootfs, []string{"true"}, nil, []string{"CAP_SYS_RESOURCE"}, false)
			_, _, err := RunContainer(context.Background(), e.state, filepath.Join(e.dir, "nores"), "nores", spec)
			if err == nil || !strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
				t.Errorf("CAP_SYS_RESOURCE on a host without it: err %v, want one naming it", err)
			}
			t.Skip("runc cannot grant CAP_SYS_RESOURCE: not in this host's capability bounding set")
		}
		if m := e.capEff(t, "CAP_IPC_LOCK", "CAP_SYS_RESOURCE"); !has(m, ipcLock) || !has(m, sysResource) {
			t.Errorf("IPC_LOCK and SYS_RESOURCE added: CapEff %016x", m)
		}
	})
}

// TestRuntimeCDIDevice injects a claim's CDI devices as containerd does and
// checks the container sees them, allowed by its device cgroup.
func TestRuntimeCDIDevice(t *testing.T) {
	e := newRuntimeEnv(t)
	preset, err := hcatest.Preset("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	node, err := hcatest.Build(filepath.Join(e.dir, "node"), preset)
	if err != nil {
		t.Fatal(err)
	}
	if !node.CharDevices {
		t.Fatal("hcatest made no character devices although running as root")
	}
	inv, err := hca.Discover(hca.WithSysfsRoot(node.SysfsRoot), hca.WithDevRoot(node.DevRoot))
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(inv.HCAs, func(h hca.HCA) bool { return h.Name == "mlx5_3" })
	if i < 0 {
		t.Fatal("no mlx5_3 discovered")
	}
	h := inv.HCAs[i]
	opts := cdi.EditOptions{Env: true, HostDevRoot: node.DevRoot}
	edits, err := cdi.DeviceEdits(h, opts)
	if err != nil {
		t.Fatal(err)
	}
	const uid = "6b1e0c8a-2f4d-4e5a-9c3b-7d8e9f0a1b2c"
	name := cdi.DeviceName(uid, "mlx5-3", "")
	specDir := filepath.Join(e.dir, "cdi")
	err = cdi.NewSpecDir(specDir).WriteClaim(uid, cdi.CommonEdits(inv.RDMACM, []hca.HCA{h}, opts),
		[]cdi.ClaimDevice{{Name: name, Edits: edits}})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(specDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}

	spec := func(script string) *specs.Spec {
		s := ContainerSpec(e.rootfs, []string{"sh", "-c", script}, nil, nil, false)
		if unresolved, err := cache.InjectDevices(s, cdi.QualifiedName(name)); err != nil {
			t.Fatalf("CDI injection: %v (unresolved %v)", err, unresolved)
		}
		return s
	}

	_, out := e.run(t, spec("ls /dev/infiniband | tr '\\n' ' '"))
	if out != "rdma_cm uverbs3 " {
		t.Errorf("ls /dev/infiniband: %q, want %q", out, "rdma_cm uverbs3 ")
	}

	_, out = e.run(t, spec("ls -l /dev/infiniband"))
	want := map[string]string{"rdma_cm": "10, 58", "uverbs3": "231, 195"}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[0] == "total" {
			continue
		}
		file := f[len(f)-1]
		if got := f[4] + " " + f[5]; f[0] != "crw-rw-rw-" || got != want[file] {
			t.Errorf("ls -l: %q: want crw-rw-rw- %s", line, want[file])
		}
		delete(want, file)
	}
	if len(want) > 0 {
		t.Errorf("ls -l /dev/infiniband lacks %v:\n%s", want, out)
	}

	_, out = e.run(t, spec("env | grep -e RDMA -e NCCL -e UCX | sort"))
	wantEnv := "NCCL_IB_HCA==mlx5_3\nRDMA_DEVICES=mlx5_3\nRDMA_DEVICE_MLX5_3=/dev/infiniband/uverbs3\nUCX_NET_DEVICES=mlx5_3:1\n"
	if out != wantEnv {
		t.Errorf("env:\n%s\nwant:\n%s", out, wantEnv)
	}

	// A node the device cgroup denies fails to open with EPERM, whatever
	// it is: the control is uverbs4 (231:196), created but not allowed.
	// An allowed node reaches the kernel, which has no driver behind it
	// here: ENXIO for 231:195 (no uverbs cdev of that minor); for 10:58
	// ENODEV, or success where rdma_ucm loads on demand.
	const denied = "Operation not permitted"
	control := spec("cat /dev/infiniband/uverbs4")
	mode := os.FileMode(0o666)
	control.Linux.Devices = append(control.Linux.Devices, specs.LinuxDevice{
		Path: "/dev/infiniband/uverbs4", Type: "c", Major: 231, Minor: 196, FileMode: &mode,
	})
	code, out := e.run(t, control)
	if code == 0 || !strings.Contains(out, denied) {
		t.Fatalf("cat of a node the cgroup does not allow: exit %d, %q; want %q", code, out, denied)
	}
	code, out = e.run(t, spec("cat /dev/infiniband/uverbs3"))
	if _, err := os.Stat("/sys/class/infiniband_verbs/uverbs3"); errors.Is(err, os.ErrNotExist) {
		if want := "No such device or address"; code == 0 || !strings.Contains(out, want) {
			t.Errorf("cat /dev/infiniband/uverbs3: exit %d, %q; want %q (ENXIO)", code, out, want)
		}
	} else if strings.Contains(out, denied) {
		t.Errorf("cat /dev/infiniband/uverbs3: %q: the device cgroup denies it", out)
	}
	_, out = e.run(t, spec("cat /dev/infiniband/rdma_cm"))
	if strings.Contains(out, denied) {
		t.Errorf("cat /dev/infiniband/rdma_cm: %q: the device cgroup denies it", out)
	}
}

func TestRuntimeCancel(t *testing.T) {
	e := newRuntimeEnv(t)
	cases := []struct {
		name  string
		delay time.Duration // -1: once runc says the container runs
	}{{"at-once", 0}, {"starting", 20 * time.Millisecond}, {"running", -1}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := "sleep-" + c.name
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				if c.delay >= 0 {
					time.Sleep(c.delay)
				} else {
					waitRunning(e.state, id)
				}
				cancel()
			}()
			start := time.Now()
			spec := ContainerSpec(e.rootfs, []string{"sleep", "60"}, nil, nil, false)
			code, out, err := RunContainer(ctx, e.state, filepath.Join(e.dir, id), id, spec)
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("cancelled run took %v", took)
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err %v, want context.Canceled (exit %d, output %q)", err, code, out)
			}
			if c.delay < 0 && code != 128+9 {
				t.Errorf("exit %d, want 137 (SIGKILL)", code)
			}
			if ids := runcList(t, e.state); len(ids) > 0 {
				t.Errorf("runc still lists %v", ids)
			}
		})
	}
}

// waitRunning polls runc until container id runs (at most 30s).
func waitRunning(root, id string) {
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		out, err := exec.Command("runc", "--root", root, "state", id).Output()
		if err == nil && strings.Contains(string(out), `"status": "running"`) {
			return
		}
	}
}
