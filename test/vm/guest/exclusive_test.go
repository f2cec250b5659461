package guest

// Exclusive RDMA netns mode (issue 15) on the real kernel: the mode read
// both ways (rdmactl, the driver, its slice), pkg/rdmanl's SET against the
// kernel, a pod off the host network refused by rdma-dra-hook netns with
// the kernel's answer (Soft-RoCE cannot change namespace) and its command
// never run, and a hostNetwork pod unaffected. The kernel changes the mode
// only while no other network namespace exists; the test puts it back to
// shared when it ends.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// guestTool is a product binary test/vm put into the image (its path in
// env), or a skip saying it is missing.
func guestTool(t *testing.T, env string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		t.Skipf("%s is not set: the image has no such binary", env)
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("%s: %v", env, err)
	}
	return p
}

// rdmactlMode runs rdmactl discover (table and yaml) and checks both name
// mode.
func rdmactlMode(t *testing.T, rdmactl, mode string) {
	t.Helper()
	table := string(command(t, rdmactl, "discover"))
	want := "RDMA netns mode: " + mode + " (RDMA netlink)"
	if !strings.Contains(table, want) {
		t.Errorf("rdmactl discover does not say %q:\n%s", want, table)
	}
	// netnsMode is node-wide and lives in the metadata, not the slice:
	// -o wide lists it per HCA with where it lives.
	wide := string(command(t, rdmactl, "discover", "-o", "wide"))
	var rows []string
	for _, line := range strings.Split(wide, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == driverName+"/netnsMode" {
			rows = append(rows, line)
			if f[1] != mode || f[2] != "metadata" {
				t.Errorf("rdmactl discover -o wide: %q, want netnsMode %s in the metadata", line, mode)
			}
		}
	}
	if len(rows) != len(rdmaDevices()) {
		t.Errorf("rdmactl discover -o wide has %d netnsMode rows, want one per HCA (%d):\n%s", len(rows), len(rdmaDevices()), wide)
	}
	y := string(command(t, rdmactl, "discover", "-o", "yaml"))
	if strings.Contains(y, "netnsMode") {
		t.Errorf("rdmactl discover -o yaml: the slice carries netnsMode, which belongs to the metadata:\n%s", y)
	}
	if len(rows) > 0 {
		t.Logf("rdmactl discover: %q; -o wide: %d devices with %q", want, len(rows), strings.TrimSpace(rows[0]))
	}
}

// runRdmanlTests runs pkg/rdmanl's real-kernel tests (built by test/vm)
// and asserts each ran and passed, none skipped.
func runRdmanlTests(t *testing.T) {
	t.Helper()
	bin := guestTool(t, "RDMA_DRA_VM_RDMANL_TEST")
	out, err := exec.Command(bin, "-test.v", "-test.count=1", "-test.run=^TestRealKernel").CombinedOutput()
	if err != nil {
		t.Errorf("pkg/rdmanl's real-kernel tests: %v\n%s", err, out)
	}
	for _, name := range []string{"TestRealKernel", "TestRealKernelSet", "TestRealKernelRoute", "TestRealKernelUplink", "TestRealKernelPortNetdev", "TestRealKernelLinks", "TestRealKernelNetdevUse"} {
		if !strings.Contains(string(out), "--- PASS: "+name+" ") {
			t.Errorf("pkg/rdmanl %s did not pass:\n%s", name, out)
		}
	}
	if strings.Contains(string(out), "--- SKIP") {
		t.Errorf("pkg/rdmanl's real-kernel tests skipped in the VM:\n%s", out)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "--- ") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	t.Logf("pkg/rdmanl on the real kernel: %s", strings.Join(lines, "; "))
}

// TestRdmanlRealKernel: pkg/rdmanl's tests that ask the kernel, in shared
// mode (TestExclusiveNetnsMode runs them in exclusive mode too).
func TestRdmanlRealKernel(t *testing.T) {
	inGuest(t)
	runRdmanlTests(t)
}

// withOwnNetns gives the container a new network namespace (a pod off the
// host network).
func withOwnNetns(spec *specs.Spec) *specs.Spec {
	spec.Linux.Namespaces = append(spec.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace})
	return spec
}

// rdmaDevNames lists `rdma dev`'s devices of the guest's namespace.
func rdmaDevNames(t *testing.T) []string {
	t.Helper()
	var devs []struct {
		Name string `json:"ifname"`
	}
	rdmaJSON(t, &devs, "dev")
	var out []string
	for _, d := range devs {
		out = append(out, d.Name)
	}
	return out
}

// exclusiveEnv is TestExclusiveNetnsMode's node (once started) and tools.
type exclusiveEnv struct {
	n             *node
	hook, rdmactl string
}

func TestExclusiveNetnsMode(t *testing.T) {
	inGuest(t)
	skipWithoutRunc(t)
	f := &exclusiveEnv{hook: hookPath(t), rdmactl: guestTool(t, "RDMA_DRA_VM_RDMACTL")}
	// Registered first, so it runs after the driver has stopped.
	t.Cleanup(func() {
		if err := setNetnsMode("shared"); err != nil {
			t.Errorf("restoring shared netns mode: %v", err)
		}
	})
	start := time.Now()
	if err := setNetnsMode("exclusive"); err != nil {
		t.Fatal(err)
	}
	t.Logf("rdma system set netns exclusive: took %v", time.Since(start).Round(time.Millisecond))

	t.Run("mode detected", f.modeDetected)

	t.Run("rdmanl SET: EINVAL for an absent index, EOPNOTSUPP for rxe0", f.rdmanlSetErrors)

	f.n = startNode(t, nodeConfig{hookPath: f.hook, pods: true, hostRDMA: true})
	n := f.n
	inv := n.drv.Inventory()
	if inv.NetnsMode != hca.NetnsExclusive {
		t.Errorf("the driver reads netns mode %q, want exclusive", inv.NetnsMode)
	}
	// The daemon, in the initial namespace, still sees every HCA.
	var names []string
	for _, h := range inv.HCAs {
		names = append(names, h.Name)
	}
	if !slices.Equal(names, rdmaDevices()) {
		t.Errorf("the driver's inventory in exclusive mode: %v, want %v", names, rdmaDevices())
	}
	if sl, err := n.slice(t.Context()); err != nil {
		t.Fatal(err)
	} else {
		if len(sl.Spec.Devices) != len(rdmaDevices()) {
			t.Errorf("the slice in exclusive mode has %d devices, want %d", len(sl.Spec.Devices), len(rdmaDevices()))
		}
		for _, d := range sl.Spec.Devices {
			if a, ok := d.Attributes[driverName+"/netnsMode"]; ok {
				t.Errorf("slice device %s carries netnsMode %v: it belongs to the metadata", d.Name, a)
			}
		}
	}

	t.Run("pod off the host network refused, its command never run", f.podOffHostNetworkRefused)

	t.Run("moveNetdev: the node's uplink never moves, found by identity", f.uplinkNeverMoves)

	t.Run("hostNetwork pod: no hook, opens rxe0", f.hostNetworkPod)

	t.Run("back to shared", f.backToShared)
}

func (f *exclusiveEnv) modeDetected(t *testing.T) {
	rdmactlMode(t, f.rdmactl, "exclusive")
	runRdmanlTests(t)
}

func (f *exclusiveEnv) rdmanlSetErrors(t *testing.T) {
	c, err := rdmanl.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	self, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	err = c.MoveToNetns(rdmanl.Device{Index: 1 << 30, Name: "absent"}, int(self.Fd()))
	if !errors.Is(err, syscall.EINVAL) {
		t.Errorf("moving an absent device index: %v, want EINVAL", err)
	} else {
		t.Logf("moving an absent device index: %v", err)
	}
	// Another namespace: a process of its own holds it.
	holder := exec.Command("sleep", "60")
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder.Process.Kill(); holder.Wait() }()
	ns, err := os.Open("/proc/" + strconv.Itoa(holder.Process.Pid) + "/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	dev, ok, err := c.Device("rxe0")
	if err != nil || !ok {
		t.Fatalf("rxe0 over RDMA netlink: found %v, %v", ok, err)
	}
	err = c.MoveToNetns(dev, int(ns.Fd()))
	if !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("moving rxe0 into another namespace: %v, want EOPNOTSUPP", err)
	} else {
		t.Logf("moving rxe0 into another namespace: %v", err)
	}
}

func (f *exclusiveEnv) podOffHostNetworkRefused(t *testing.T) {
	f.n.pod("netns-pod", false)
	c := f.n.claim("netns-pod", []string{"rxe0"})
	ids := f.n.prepare(c)
	defer f.n.unprepare(c)
	out := t.TempDir()
	id := "netns-pod"
	spec := withCDI(t, withOut(withOwnNetns(containerSpec(id, "touch", "/out/ran")), out), f.n.cdiDir, ids...)
	if got, want := createRuntimeHooks(spec), [][]string{{f.hook, "rdma-dra-hook", "netns", "--device=rxe0"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("createRuntime hooks %q, want %q", got, want)
	}
	r := runContainer(t, id, spec, 60*time.Second)
	t.Logf("runc run %s: exit %d\n%s", id, r.exit, r.out)
	want := regexp.MustCompile(regexp.QuoteMeta("rdma-dra-hook: HCA rxe0: cannot move it into the network namespace of container "+id+" (pid ") +
		`\d+` + regexp.QuoteMeta("): rdma netlink: netns move of rxe0: operation not supported"))
	if r.exit == 0 || !want.MatchString(r.out) {
		t.Errorf("runc run: exit %d; want a refusal matching %q", r.exit, want)
	}
	if _, err := os.Stat(filepath.Join(out, "ran")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the container's command ran without its HCA (/out/ran: %v)", err)
	}
	if devs := rdmaDevNames(t); !slices.Contains(devs, "rxe0") {
		t.Errorf("rdma dev after the refusal: %v, want rxe0 still in the host's namespace", devs)
	} else {
		t.Logf("rdma dev after the refusal: %v", devs)
	}
}

func (f *exclusiveEnv) uplinkNeverMoves(t *testing.T) {
	// The hook as the runtime runs it, for a container in a namespace
	// of its own: rxe0's port netdev is eth0 (ifindex from RDMA
	// netlink), which holds 10.0.2.15; rxe1's is eth1, here given the
	// default route. Both are refused before anything moves; with
	// neither, the checks pass and the kernel refuses rxe0's move.
	if def, err := exec.Command("ip", "route", "show", "default").Output(); err != nil || len(strings.TrimSpace(string(def))) > 0 {
		t.Skipf("the guest's /init adds no default route, but there is one (%q, %v)", def, err)
	}
	holder := exec.Command("sleep", "60")
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder.Process.Kill(); holder.Wait() }()
	state := fmt.Sprintf(`{"id":"uplink","pid":%d}`, holder.Process.Pid)
	runHook := func(args ...string) (string, error) {
		cmd := exec.Command(f.hook, append([]string{"netns", "--move-netdevs"}, args...)...)
		cmd.Stdin = strings.NewReader(state)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	eth0, err := net.InterfaceByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	out, err := runHook("--device=rxe0", "--node-ip=10.0.2.15")
	want := fmt.Sprintf("HCA rxe0: refusing to move its netdev eth0 (ifindex %d, port 1) into the network namespace of container uplink", eth0.Index)
	if err == nil || !strings.Contains(out, want) || !strings.Contains(out, "it holds the node's InternalIP 10.0.2.15") {
		t.Errorf("rxe0 with eth0 holding the InternalIP: %v\n%s\nwant a refusal containing %q", err, out, want)
	} else {
		t.Logf("rxe0, eth0 holding the InternalIP: %s", strings.TrimSpace(out))
	}
	if out, err := exec.Command("ip", "route", "add", "default", "dev", "eth1").CombinedOutput(); err != nil {
		t.Errorf("ip route add default dev eth1: %v: %s", err, out)
	} else {
		defer exec.Command("ip", "route", "del", "default", "dev", "eth1").Run()
		out, err := runHook("--device=rxe1")
		if err == nil || !strings.Contains(out, "HCA rxe1: refusing to move its netdev eth1") || !strings.Contains(out, "it carries the node's default route") {
			t.Errorf("rxe1 with eth1 carrying the default route: %v\n%s", err, out)
		} else {
			t.Logf("rxe1, eth1 carrying the default route: %s", strings.TrimSpace(out))
		}
	}
	out, err = runHook("--device=rxe0", "--node-ip=10.9.9.9")
	if err == nil || !strings.Contains(out, "HCA rxe0: cannot move it into the network namespace of container uplink") {
		t.Errorf("rxe0 with no uplink: %v\n%s\nwant the kernel's refusal of the RDMA move (the checks passed)", err, out)
	}
	if devs := rdmaDevNames(t); !slices.Contains(devs, "rxe0") || !slices.Contains(devs, "rxe1") {
		t.Errorf("rdma dev after the refusals: %v, want rxe0 and rxe1 still in the host's namespace", devs)
	}
	if _, err := net.InterfaceByName("eth1"); err != nil {
		t.Errorf("eth1 after the refusals: %v", err)
	}
}

func (f *exclusiveEnv) hostNetworkPod(t *testing.T) {
	f.n.pod("host-pod", true)
	c := f.n.claim("host-pod", []string{"rxe0"})
	ids := f.n.prepare(c)
	defer f.n.unprepare(c)
	id := "host-pod"
	spec := withCDI(t, containerSpec(id, "ibv_devinfo", "-d", "rxe0"), f.n.cdiDir, ids...)
	if got := createRuntimeHooks(spec); len(got) != 0 {
		t.Errorf("hostNetwork pod: createRuntime hooks %q, want none", got)
	}
	r := runContainer(t, id, spec, 60*time.Second)
	if r.exit != 0 || !strings.Contains(r.out, "PORT_ACTIVE") {
		t.Errorf("ibv_devinfo -d rxe0 in the hostNetwork container: exit %d\n%s", r.exit, r.out)
	} else {
		t.Logf("ibv_devinfo -d rxe0 in the hostNetwork container: exit 0, %s", firstMatch(r.out, `state:\s+\S+`))
	}
}

func (f *exclusiveEnv) backToShared(t *testing.T) {
	start := time.Now()
	if err := setNetnsMode("shared"); err != nil {
		t.Fatal(err)
	}
	t.Logf("rdma system set netns shared: took %v", time.Since(start).Round(time.Millisecond))
	rdmactlMode(t, f.rdmactl, "shared")
}

func firstMatch(s, re string) string { return regexp.MustCompile(re).FindString(s) }
