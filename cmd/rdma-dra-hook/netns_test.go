package main

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// fakeNetns is the kernel as the netns command sees it: where each RDMA
// device is ("host", "ctr" for the container's namespace, anything else
// for another pod's), the netdevs (the HCA's ports' and others), and the
// answers to give.
type fakeNetns struct {
	same     bool
	where    map[string]string // "rdma:mlx5_0" -> namespace
	protocol string            // the RDMA device's: "roce", "ib", ...
	parent   string            // the device under it: "0000:17:00.0"
	links    []fakeLink
	uses     map[int]string // nodeUse's answer by ifindex
	moveErr  error          // the kernel's answer to an RDMA move
	linkErr  error          // the kernel's answer to a netdev move
	queryErr error
	useErr   error
	moves    []string
	closed   bool
}

// fakeLink is one netdev; port is the HCA's port it belongs to, 0 for
// none (IPoIB, or another interface of the host).
type fakeLink struct {
	index         int
	name          string
	port          uint32
	ns            string
	parent        string // the device under it
	lower, master int
}

func (f *fakeNetns) sameNetns() (bool, error) { return f.same, nil }

func nsOf(s side) string {
	if s == container {
		return "ctr"
	}
	return "host"
}

func (f *fakeNetns) rdmaDevice(s side, name string) (rdmanl.Device, bool, error) {
	if f.queryErr != nil {
		return rdmanl.Device{}, false, f.queryErr
	}
	return rdmanl.Device{Index: 3, Name: name, Protocol: f.protocol}, f.where["rdma:"+name] == nsOf(s), nil
}

func (f *fakeNetns) moveRDMA(dev rdmanl.Device) error {
	if f.moveErr != nil {
		return f.moveErr
	}
	f.where["rdma:"+dev.Name] = "ctr"
	f.moves = append(f.moves, "rdma:"+dev.Name)
	return nil
}

// ports answers as the kernel does: a port names its netdev only when
// the netdev is in the asking namespace. Port 1 exists even without links.
func (f *fakeNetns) ports(s side, dev rdmanl.Device) ([]rdmanl.Port, error) {
	if f.where["rdma:"+dev.Name] != nsOf(s) {
		return nil, syscall.EINVAL // the kernel: no such device here
	}
	byPort := map[uint32]rdmanl.Port{1: {DevIndex: dev.Index, DevName: dev.Name, Index: 1}}
	for _, l := range f.links {
		if l.port == 0 {
			continue
		}
		p := rdmanl.Port{DevIndex: dev.Index, DevName: dev.Name, Index: l.port}
		if l.ns == nsOf(s) {
			p.NetdevIndex, p.Netdev = uint32(l.index), l.name
		}
		byPort[l.port] = p
	}
	var out []rdmanl.Port
	for i := uint32(1); i <= uint32(len(byPort)); i++ {
		out = append(out, byPort[i])
	}
	return out, nil
}

func (f *fakeNetns) hostLinks() ([]rdmanl.Link, error) {
	var out []rdmanl.Link
	for _, l := range f.links {
		if l.ns == "host" {
			out = append(out, rdmanl.Link{Index: l.index, Name: l.name, Parent: l.parent, Lower: l.lower, Master: l.master})
		}
	}
	return out, nil
}

func (f *fakeNetns) parentDevice(string) (string, error) { return f.parent, nil }

func (f *fakeNetns) nodeUse(index int, _ []netip.Addr) (string, error) {
	return f.uses[index], f.useErr
}

func (f *fakeNetns) moveLink(index int) error {
	if f.linkErr != nil {
		return f.linkErr
	}
	for i, l := range f.links {
		if l.index == index && l.ns == "host" {
			f.links[i].ns = "ctr"
			f.moves = append(f.moves, fmt.Sprintf("net:%d", index))
			return nil
		}
	}
	return &rdmanl.Error{Op: fmt.Sprintf("netns move of netdev ifindex %d", index), Err: syscall.ENODEV, Route: true}
}

func (f *fakeNetns) close() error { f.closed = true; return nil }

// netnsState is the OCI state the runtime hands the hook: container ctr1, pid 42.
const netnsState = `{"ociVersion":"1.2.0","id":"ctr1","status":"creating","pid":42,"bundle":"/b"}`

// netnsCase is one run of the netns hook against a fake kernel.
type netnsCase struct {
	name      string
	args      []string
	stdin     string
	kernel    fakeNetns
	wantMoves []string
	wantRDMA  string // where the RDMA device is afterwards, if checked
	wantErr   string
	wantLog   string
}

// netnsCases are TestNetns's cases.
func netnsCases() []netnsCase { return append(netnsRoCECases(), netnsOtherCases()...) }

// netnsRoCECases: a RoCE HCA and its port's netdev, moved by ifindex,
// renamed, or refused for carrying the node's traffic.
func netnsRoCECases() []netnsCase {
	state := netnsState
	inHost := map[string]string{"rdma:mlx5_0": "host"}
	roce := func(ns string) []fakeLink { return []fakeLink{{index: 7, name: "ens1f0np0", port: 1, ns: ns}} }
	// The HCA's netdev renamed since prepare; in the second, the old
	// name now belongs to another interface.
	renamed := []fakeLink{{index: 7, name: "ens1f0np0new", port: 1, ns: "host"}}
	trap := []fakeLink{{index: 7, name: "ens1f0np0new", port: 1, ns: "host"}, {index: 2, name: "ens1f0np0", ns: "host"}}
	return []netnsCase{
		{
			name: "moves the device", args: []string{"netns", "--device=mlx5_0"}, stdin: state,
			kernel:    fakeNetns{protocol: "roce", where: inHost, links: roce("host")},
			wantMoves: []string{"rdma:mlx5_0"},
		},
		{
			name: "and its port's netdev after it, by ifindex", args: []string{"netns", "--device=mlx5_0", "--move-netdevs", "--node-ip=10.0.0.5"}, stdin: state,
			kernel:    fakeNetns{protocol: "roce", where: inHost, links: roce("host")},
			wantMoves: []string{"rdma:mlx5_0", "net:7"},
			wantLog:   "HCA mlx5_0: moved its netdev ens1f0np0 (ifindex 7, port 1) into the network namespace of container ctr1 (pid 42)",
		},
		{
			name: "renamed since prepare: the port's netdev moves, by ifindex", args: []string{"netns", "--device=mlx5_0", "--move-netdevs"}, stdin: state,
			kernel:    fakeNetns{protocol: "roce", where: inHost, links: trap},
			wantMoves: []string{"rdma:mlx5_0", "net:7"},
			wantLog:   "moved its netdev ens1f0np0new (ifindex 7, port 1)",
		},
		{
			name: "old spec, renamed netdev: ifindex 7 moves, and the log says which", args: []string{"netns", "--device=mlx5_0", "--netdev=ens1f0np0"}, stdin: state,
			kernel:    fakeNetns{protocol: "roce", where: inHost, links: renamed},
			wantMoves: []string{"rdma:mlx5_0", "net:7"},
			wantLog: "HCA mlx5_0: netdev ens1f0np0, named by its CDI spec, is gone; the HCA's netdevs now: ens1f0np0new (ifindex 7, port 1) (renamed since prepare)\n" +
				"rdma-dra-hook: HCA mlx5_0: moved its netdev ens1f0np0new (ifindex 7, port 1)",
		},
		{
			name: "old spec, its name now another interface's: refused, nothing moved", args: []string{"netns", "--device=mlx5_0", "--netdev=ens1f0np0"}, stdin: state,
			kernel: fakeNetns{protocol: "roce", where: inHost, links: trap},
			wantErr: "HCA mlx5_0: its CDI spec (written at prepare) names netdev ens1f0np0, but that name is now ifindex 2, which the kernel does not name as the HCA's; " +
				"the HCA's netdevs now: ens1f0np0new (ifindex 7, port 1); refusing to move anything",
			wantRDMA: "host",
		},
		{
			name: "old spec, name unchanged", args: []string{"netns", "--device=mlx5_0", "--netdev=ens1f0np0"}, stdin: state,
			kernel:    fakeNetns{protocol: "roce", where: inHost, links: roce("host")},
			wantMoves: []string{"rdma:mlx5_0", "net:7"},
		},
		{
			name: "the node's uplink: refused before anything moves", args: []string{"netns", "--device=mlx5_0", "--move-netdevs"}, stdin: state,
			kernel: fakeNetns{protocol: "roce", where: inHost, links: roce("host"), uses: map[int]string{7: "carries the node's default route"}},
			wantErr: "HCA mlx5_0: refusing to move its netdev ens1f0np0 (ifindex 7, port 1) into the network namespace of container ctr1 (pid 42): " +
				"it carries the node's default route",
			wantRDMA: "host",
		},
		{
			name: "the node's InternalIP: refused", args: []string{"netns", "--device=mlx5_0", "--move-netdevs", "--node-ip=10.0.0.5"}, stdin: state,
			kernel:   fakeNetns{protocol: "roce", where: inHost, links: roce("host"), uses: map[int]string{7: "holds the node's InternalIP 10.0.0.5"}},
			wantErr:  "it holds the node's InternalIP 10.0.0.5",
			wantRDMA: "host",
		},
		{
			name: "the check cannot be made: refused", args: []string{"netns", "--device=mlx5_0", "--move-netdevs"}, stdin: state,
			kernel:   fakeNetns{protocol: "roce", where: inHost, links: roce("host"), useErr: &rdmanl.Error{Op: "route dump", Err: syscall.EPERM, Route: true}},
			wantErr:  "HCA mlx5_0: checking whether the node needs its netdev ens1f0np0 (ifindex 7, port 1): rtnetlink: route dump: operation not permitted",
			wantRDMA: "host",
		},
		{
			name: "a RoCE port whose netdev is elsewhere: refused", args: []string{"netns", "--device=mlx5_0", "--move-netdevs"}, stdin: state,
			kernel: fakeNetns{protocol: "roce", where: inHost, links: roce("pod-b")},
			wantErr: "HCA mlx5_0: port 1 is roce but the kernel reports no netdev for it in the host's network namespace: " +
				"another network namespace holds it",
			wantRDMA: "host",
		},
	}
}

// netnsOtherCases: InfiniBand and IPoIB, stacked netdevs, containers that
// find the HCA moved already, and what cannot be done.
func netnsOtherCases() []netnsCase {
	state := netnsState
	eopnotsupp := &rdmanl.Error{Op: "netns move of rxe0", Err: syscall.EOPNOTSUPP}
	inHost := map[string]string{"rdma:mlx5_0": "host"}
	roce := func(ns string) []fakeLink { return []fakeLink{{index: 7, name: "ens1f0np0", port: 1, ns: ns}} }
	return []netnsCase{
		{
			name: "InfiniBand: no port netdev, nothing else moves", args: []string{"netns", "--device=mlx5_0", "--move-netdevs"}, stdin: state,
			kernel:    fakeNetns{protocol: "ib", where: inHost},
			wantMoves: []string{"rdma:mlx5_0"},
		},
		{
			name: "IPoIB: the netdevs on the HCA's PCI function, by ifindex", args: []string{"netns", "--device=mlx5_1", "--move-netdevs"}, stdin: state,
			kernel: fakeNetns{protocol: "ib", parent: "0000:17:00.0", where: map[string]string{"rdma:mlx5_1": "host"}, links: []fakeLink{
				{index: 4, name: "eth0", ns: "host", parent: "0000:03:00.0"},
				{index: 9, name: "ibp23s0", ns: "host", parent: "0000:17:00.0"},
				{index: 10, name: "ibp24s0", ns: "host", parent: "0000:18:00.0"},
			}},
			wantMoves: []string{"rdma:mlx5_1", "net:9"},
			wantLog:   "moved its netdev ibp23s0 (ifindex 9, on 0000:17:00.0)",
		},
		{
			name: "IPoIB on a kernel that names no parents: refused", args: []string{"netns", "--device=mlx5_1", "--move-netdevs"}, stdin: state,
			kernel: fakeNetns{protocol: "ib", parent: "0000:17:00.0", where: map[string]string{"rdma:mlx5_1": "host"}, links: []fakeLink{
				{index: 9, name: "ibp23s0", ns: "host"}}},
			wantErr:  "HCA mlx5_1: this kernel names no netdev's parent device (IFLA_PARENT_DEV_NAME; Linux 6.1 does)",
			wantRDMA: "host",
		},
		{
			name: "old spec naming the IPoIB netdev", args: []string{"netns", "--device=mlx5_1", "--netdev=ibp23s0"}, stdin: state,
			kernel: fakeNetns{protocol: "ib", parent: "0000:17:00.0", where: map[string]string{"rdma:mlx5_1": "host"}, links: []fakeLink{
				{index: 9, name: "ibp23s0", ns: "host", parent: "0000:17:00.0"}}},
			wantMoves: []string{"rdma:mlx5_1", "net:9"},
		},
		{
			name: "a VLAN on it holds the InternalIP: refused", args: []string{"netns", "--device=mlx5_0", "--move-netdevs"}, stdin: state,
			kernel: fakeNetns{protocol: "roce", where: inHost, uses: map[int]string{12: "holds the node's InternalIP 10.0.0.5"}, links: []fakeLink{
				{index: 7, name: "ens1f0np0", port: 1, ns: "host"}, {index: 12, name: "ens1f0np0.100", ns: "host", lower: 7}}},
			wantErr:  "HCA mlx5_0: refusing to move its netdev ens1f0np0 (ifindex 7, port 1) into the network namespace of container ctr1 (pid 42): ens1f0np0.100 (ifindex 12), stacked on it, holds the node's InternalIP 10.0.0.5",
			wantRDMA: "host",
		},
		{
			name: "its bond carries the default route: refused", args: []string{"netns", "--device=mlx5_0", "--move-netdevs"}, stdin: state,
			kernel: fakeNetns{protocol: "roce", where: inHost, uses: map[int]string{5: "carries the node's default route"}, links: []fakeLink{
				{index: 7, name: "ens1f0np0", port: 1, ns: "host", master: 5}, {index: 5, name: "bond0", ns: "host"}}},
			wantErr:  "ifindex 5, its master, carries the node's default route",
			wantRDMA: "host",
		},
		{
			name: "the pod's second container: already there", args: []string{"netns", "--device=mlx5_0", "--move-netdevs"}, stdin: state,
			kernel: fakeNetns{protocol: "roce", where: map[string]string{"rdma:mlx5_0": "ctr"}, links: roce("ctr")},
		},
		{
			name: "a restarted container whose first start moved the HCA but not its netdev", args: []string{"netns", "--device=mlx5_0", "--move-netdevs"}, stdin: state,
			kernel:  fakeNetns{protocol: "roce", where: map[string]string{"rdma:mlx5_0": "ctr"}, links: roce("host")},
			wantErr: "HCA mlx5_0: port 1 is roce but the kernel reports no netdev for it in the network namespace of container ctr1 (pid 42)",
		},
		{
			name: "hostNetwork container: nothing to move", args: []string{"netns", "--device=mlx5_0", "--move-netdevs"}, stdin: state,
			kernel: fakeNetns{same: true, where: inHost, links: roce("host")},
		},
		{
			name: "in another pod's namespace", args: []string{"netns", "--device=mlx5_0"}, stdin: state,
			kernel: fakeNetns{where: map[string]string{"rdma:mlx5_0": "pod-b"}},
			wantErr: "HCA mlx5_0: RDMA device is in neither the host's network namespace nor the network namespace of container ctr1 (pid 42): " +
				"another pod's network namespace holds it, or it is gone",
		},
		{
			name: "Soft-RoCE cannot move", args: []string{"netns", "--device=rxe0", "--move-netdevs"}, stdin: state,
			kernel:   fakeNetns{protocol: "roce", moveErr: eopnotsupp, where: map[string]string{"rdma:rxe0": "host"}, links: []fakeLink{{index: 2, name: "eth0", port: 1, ns: "host"}}},
			wantRDMA: "host", // nothing moved
			wantErr: "HCA rxe0: cannot move it into the network namespace of container ctr1 (pid 42): " +
				"rdma netlink: netns move of rxe0: operation not supported (the kernel moves only devices whose driver",
		},
		{
			name: "netdev move refused", args: []string{"netns", "--device=mlx5_0", "--move-netdevs"}, stdin: state,
			kernel: fakeNetns{protocol: "roce", linkErr: &rdmanl.Error{Op: "netns move of netdev ifindex 7", Err: syscall.EBUSY, Route: true},
				where: inHost, links: roce("host")},
			wantMoves: []string{"rdma:mlx5_0"},
			wantErr:   "HCA mlx5_0: cannot move its netdev ens1f0np0 (ifindex 7, port 1) into the network namespace of container ctr1 (pid 42): rtnetlink: netns move of netdev ifindex 7: device or resource busy",
		},
		{
			name: "no RDMA netlink", args: []string{"netns", "--device=mlx5_0"}, stdin: state,
			kernel:  fakeNetns{queryErr: &rdmanl.Error{Op: "socket", Err: syscall.EPROTONOSUPPORT}},
			wantErr: "HCA mlx5_0: looking for it in the host's network namespace: rdma netlink: socket: protocol not supported",
		},
		{name: "no device", args: []string{"netns"}, stdin: state, wantErr: `netns: --device: RDMA device name ""`},
		{name: "bad netdev", args: []string{"netns", "--device=mlx5_0", "--netdev=a/b"}, stdin: state, wantErr: `--netdev: "a/b" is not a netdev name`},
		{name: "bad node IP", args: []string{"netns", "--device=mlx5_0", "--node-ip=10.0.0"}, stdin: state, wantErr: `netns: --node-ip: ParseAddr("10.0.0")`},
		{name: "stray argument", args: []string{"netns", "--device=mlx5_0", "x"}, stdin: state, wantErr: `unexpected arguments ["x"]`},
		{name: "not a hook", args: []string{"netns", "--device=mlx5_0"}, stdin: "", wantErr: "HCA mlx5_0: the OCI state on stdin is not JSON"},
		{name: "no process", args: []string{"netns", "--device=mlx5_0"}, stdin: `{"id":"c","pid":0}`, wantErr: "HCA mlx5_0: the OCI state of container \"c\" has no process"},
	}
}

func TestNetns(t *testing.T) {
	for _, tt := range netnsCases() {
		t.Run(tt.name, func(t *testing.T) {
			k := tt.kernel
			k.where = maps.Clone(k.where)
			if k.where == nil {
				k.where = map[string]string{}
			}
			k.links = slices.Clone(k.links)
			var gotPid int
			var log strings.Builder
			open := func(pid int) (netnsKernel, error) { gotPid = pid; return &k, nil }
			err := run(tt.args, strings.NewReader(tt.stdin), deps{openNetns: open, log: &log})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.wantMoves, k.moves); diff != "" {
				t.Errorf("moves (-want +got):\n%s", diff)
			}
			if tt.wantRDMA != "" {
				for key, ns := range k.where {
					if ns != tt.wantRDMA {
						t.Errorf("%s is in %q afterwards, want %q", key, ns, tt.wantRDMA)
					}
				}
			}
			if !strings.Contains(log.String(), tt.wantLog) {
				t.Errorf("log %q, want it to contain %q", log.String(), tt.wantLog)
			}
			if gotPid != 0 && (gotPid != 42 || !k.closed) {
				t.Errorf("opened pid %d (closed %v), want 42 and closed", gotPid, k.closed)
			}
		})
	}
	if err := run([]string{"netns", "--device=mlx5_0"}, strings.NewReader(netnsState), deps{openNetns: func(int) (netnsKernel, error) {
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
	h := k.(*hostNetns)
	// lo is in every namespace: found from a socket opened inside.
	if _, ok, err := netdevIn(h, container, "lo"); err != nil || !ok {
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
	all, err := k.hostLinks()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(all, func(l rdmanl.Link) bool { return l.Name == "rdhk0" })
	if i < 0 {
		t.Fatalf("rdhk0 not among the host's links %+v", all)
	}
	index := all[i].Index
	if all[i].Parent != "" {
		t.Errorf("a veth with parent device %q", all[i].Parent)
	}
	// A veth carries no default route and holds no address.
	if why, err := k.nodeUse(index, []netip.Addr{netip.MustParseAddr("10.0.0.5")}); why != "" || err != nil {
		t.Errorf("rdhk0's use to the node: %q, %v", why, err)
	}
	if err := k.moveLink(index); err != nil {
		t.Fatal(err)
	}
	_, inHost, err1 := netdevIn(h, host, "rdhk0")
	_, inCtr, err2 := netdevIn(h, container, "rdhk0")
	if inHost || !inCtr || err1 != nil || err2 != nil {
		t.Errorf("after the move: in host %v (%v), in the child's %v (%v); want only the child's", inHost, err1, inCtr, err2)
	}
}

// netdevIn looks a netdev up by name in one namespace.
func netdevIn(h *hostNetns, s side, name string) (int, bool, error) {
	c, err := dial(h, s, rdmanl.DialRoute)
	if err != nil {
		return 0, false, err
	}
	defer c.Close()
	return c.LinkIndex(name)
}
