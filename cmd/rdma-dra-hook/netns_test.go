package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// fakeNetns is the kernel as the netns command sees it: where each RDMA
// device and netdev is ("host", "ctr" for the container's namespace,
// anything else for another pod's), and the answers to give.
type fakeNetns struct {
	same     bool
	where    map[string]string // "rdma:mlx5_0" or "net:eth1" -> namespace
	moveErr  error             // the kernel's answer to an RDMA move
	linkErr  error             // the kernel's answer to a netdev move
	queryErr error
	moves    []string
	closed   bool
}

func (f *fakeNetns) sameNetns() (bool, error) { return f.same, nil }

func (f *fakeNetns) in(s side, key string) bool {
	want := "host"
	if s == container {
		want = "ctr"
	}
	return f.where[key] == want
}

func (f *fakeNetns) rdmaDevice(s side, name string) (rdmanl.Device, bool, error) {
	if f.queryErr != nil {
		return rdmanl.Device{}, false, f.queryErr
	}
	return rdmanl.Device{Index: 3, Name: name}, f.in(s, "rdma:"+name), nil
}

func (f *fakeNetns) moveRDMA(dev rdmanl.Device) error {
	if f.moveErr != nil {
		return f.moveErr
	}
	f.where["rdma:"+dev.Name] = "ctr"
	f.moves = append(f.moves, "rdma:"+dev.Name)
	return nil
}

func (f *fakeNetns) netdev(s side, name string) (bool, error) { return f.in(s, "net:"+name), nil }

func (f *fakeNetns) moveNetdev(name string) error {
	if f.linkErr != nil {
		return f.linkErr
	}
	f.where["net:"+name] = "ctr"
	f.moves = append(f.moves, "net:"+name)
	return nil
}

func (f *fakeNetns) close() error { f.closed = true; return nil }

func TestNetns(t *testing.T) {
	state := `{"ociVersion":"1.2.0","id":"ctr1","status":"creating","pid":42,"bundle":"/b"}`
	eopnotsupp := &rdmanl.Error{Op: "netns move of rxe0", Err: syscall.EOPNOTSUPP}
	tests := []struct {
		name      string
		args      []string
		stdin     string
		kernel    fakeNetns
		wantMoves []string
		wantWhere map[string]string
		wantErr   string
	}{
		{
			name: "moves the device", args: []string{"netns", "--device=mlx5_0"}, stdin: state,
			kernel:    fakeNetns{where: map[string]string{"rdma:mlx5_0": "host"}},
			wantMoves: []string{"rdma:mlx5_0"},
		},
		{
			name: "and its netdev after it", args: []string{"netns", "--device=mlx5_0", "--netdev=ens1f0np0"}, stdin: state,
			kernel:    fakeNetns{where: map[string]string{"rdma:mlx5_0": "host", "net:ens1f0np0": "host"}},
			wantMoves: []string{"rdma:mlx5_0", "net:ens1f0np0"},
		},
		{
			name: "the pod's second container: already there", args: []string{"netns", "--device=mlx5_0", "--netdev=ens1f0np0"}, stdin: state,
			kernel: fakeNetns{where: map[string]string{"rdma:mlx5_0": "ctr", "net:ens1f0np0": "ctr"}},
		},
		{
			name: "hostNetwork container: nothing to move", args: []string{"netns", "--device=mlx5_0"}, stdin: state,
			kernel: fakeNetns{same: true, where: map[string]string{"rdma:mlx5_0": "host"}},
		},
		{
			name: "in another pod's namespace", args: []string{"netns", "--device=mlx5_0"}, stdin: state,
			kernel: fakeNetns{where: map[string]string{"rdma:mlx5_0": "pod-b"}},
			wantErr: "HCA mlx5_0: RDMA device is in neither the host's network namespace nor the network namespace of container ctr1 (pid 42): " +
				"another pod's network namespace holds it, or it is gone",
		},
		{
			name: "netdev in another pod's namespace", args: []string{"netns", "--device=mlx5_0", "--netdev=ens1f0np0"}, stdin: state,
			kernel:    fakeNetns{where: map[string]string{"rdma:mlx5_0": "host", "net:ens1f0np0": "pod-b"}},
			wantMoves: []string{"rdma:mlx5_0"},
			wantErr:   "HCA mlx5_0: netdev ens1f0np0 is in neither the host's network namespace nor the network namespace of container ctr1",
		},
		{
			name: "Soft-RoCE cannot move", args: []string{"netns", "--device=rxe0", "--netdev=eth0"}, stdin: state,
			kernel:    fakeNetns{moveErr: eopnotsupp, where: map[string]string{"rdma:rxe0": "host", "net:eth0": "host"}},
			wantWhere: map[string]string{"rdma:rxe0": "host", "net:eth0": "host"}, // nothing moved
			wantErr: "HCA rxe0: cannot move it into the network namespace of container ctr1 (pid 42): " +
				"rdma netlink: netns move of rxe0: operation not supported (the kernel moves only devices whose driver",
		},
		{
			name: "netdev move refused", args: []string{"netns", "--device=mlx5_0", "--netdev=ens1f0np0"}, stdin: state,
			kernel: fakeNetns{linkErr: &rdmanl.Error{Op: "netns move of netdev ens1f0np0", Err: syscall.EBUSY, Route: true},
				where: map[string]string{"rdma:mlx5_0": "host", "net:ens1f0np0": "host"}},
			wantMoves: []string{"rdma:mlx5_0"},
			wantErr:   "HCA mlx5_0: cannot move its netdev ens1f0np0 into the network namespace of container ctr1 (pid 42): rtnetlink: netns move of netdev ens1f0np0: device or resource busy",
		},
		{
			name: "no RDMA netlink", args: []string{"netns", "--device=mlx5_0"}, stdin: state,
			kernel:  fakeNetns{queryErr: &rdmanl.Error{Op: "socket", Err: syscall.EPROTONOSUPPORT}},
			wantErr: "HCA mlx5_0: looking for it in the host's network namespace: rdma netlink: socket: protocol not supported",
		},
		{name: "no device", args: []string{"netns"}, stdin: state, wantErr: `netns: --device: RDMA device name ""`},
		{name: "bad netdev", args: []string{"netns", "--device=mlx5_0", "--netdev=a/b"}, stdin: state, wantErr: `--netdev: "a/b" is not a netdev name`},
		{name: "stray argument", args: []string{"netns", "--device=mlx5_0", "x"}, stdin: state, wantErr: `unexpected arguments ["x"]`},
		{name: "not a hook", args: []string{"netns", "--device=mlx5_0"}, stdin: "", wantErr: "HCA mlx5_0: the OCI state on stdin is not JSON"},
		{name: "no process", args: []string{"netns", "--device=mlx5_0"}, stdin: `{"id":"c","pid":0}`, wantErr: "HCA mlx5_0: the OCI state of container \"c\" has no process"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := tt.kernel
			if k.where == nil {
				k.where = map[string]string{}
			}
			var gotPid int
			open := func(pid int) (netnsKernel, error) { gotPid = pid; return &k, nil }
			err := run(tt.args, strings.NewReader(tt.stdin), deps{openNetns: open})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.wantMoves, k.moves); diff != "" {
				t.Errorf("moves (-want +got):\n%s", diff)
			}
			if tt.wantWhere != nil {
				if diff := cmp.Diff(tt.wantWhere, k.where); diff != "" {
					t.Errorf("devices afterwards (-want +got):\n%s", diff)
				}
			}
			if gotPid != 0 && (gotPid != 42 || !k.closed) {
				t.Errorf("opened pid %d (closed %v), want 42 and closed", gotPid, k.closed)
			}
		})
	}
	if err := run([]string{"netns", "--device=mlx5_0"}, strings.NewReader(state), deps{openNetns: func(int) (netnsKernel, error) {
		return nil, os.ErrNotExist
	}}); err == nil || !strings.Contains(err.Error(), "HCA mlx5_0: cannot open the network namespace of container ctr1 (pid 42): file does not exist") {
		t.Errorf("container gone: %v", err)
	}
}

// childInNetns starts a process in a network namespace of its own, as a
// non-hostNetwork pod's container is. It needs root.
func childInNetns(t *testing.T) int {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a network namespace of its own needs root")
	}
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a process in a new network namespace: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// TestHostNetnsRealKernel runs the real kernel seam on this host: the
// container's namespace is told from the hook's own, a netdev really
// moves (a veth: no RDMA hardware needed), and without ib_core the netns
// command fails closed naming the HCA.
func TestHostNetnsRealKernel(t *testing.T) {
	self, err := openHostNetns(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer self.close()
	if same, err := self.sameNetns(); err != nil || !same {
		t.Errorf("own namespace: same %v, %v; want true", same, err)
	}

	pid := childInNetns(t)
	k, err := openHostNetns(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer k.close()
	if same, err := k.sameNetns(); err != nil || same {
		t.Fatalf("child's namespace: same %v, %v; want false", same, err)
	}
	// lo is in every namespace: found from a socket opened inside.
	if ok, err := k.netdev(container, "lo"); err != nil || !ok {
		t.Errorf("lo in the child's namespace: %v, %v", ok, err)
	}

	state := fmt.Sprintf(`{"id":"real","pid":%d}`, pid)
	err = run([]string{"netns", "--device=rxe0"}, strings.NewReader(state), deps{openNetns: openHostNetns})
	if _, derr := rdmanl.Dial(); errors.Is(derr, syscall.EPROTONOSUPPORT) {
		if err == nil || !strings.Contains(err.Error(), "HCA rxe0: looking for it in the host's network namespace: rdma netlink: socket: protocol not supported") {
			t.Errorf("without ib_core: %v", err)
		}
	} else if err == nil {
		t.Errorf("moving rxe0 succeeded or found it; this host has RDMA netlink (%v): the VM suite covers that", derr)
	}

	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("no ip command to make a veth pair: %v", err)
	}
	if out, err := exec.Command("ip", "link", "add", "rdhk0", "type", "veth", "peer", "name", "rdhk1").CombinedOutput(); err != nil {
		t.Skipf("cannot make a veth pair: %v: %s", err, out)
	}
	defer exec.Command("ip", "link", "del", "rdhk1").Run()
	if err := k.moveNetdev("rdhk0"); err != nil {
		t.Fatal(err)
	}
	inHost, err1 := k.netdev(host, "rdhk0")
	inCtr, err2 := k.netdev(container, "rdhk0")
	if inHost || !inCtr || err1 != nil || err2 != nil {
		t.Errorf("after the move: in host %v (%v), in the child's %v (%v); want only the child's", inHost, err1, inCtr, err2)
	}
}
