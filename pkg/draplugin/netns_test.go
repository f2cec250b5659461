package draplugin_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

const hookPath = "/opt/rdma-dra-driver/bin/rdma-dra-hook"

// exclusiveEnv is the simulated dgx-h100 with its RDMA subsystem in
// exclusive netns mode (module/ib_core/parameters/netns_mode "N"), seen
// from the host's namespace (or from another one when foreign).
func exclusiveEnv(t *testing.T, foreign bool) *env {
	t.Helper()
	e := newEnv(t)
	spec, err := hcatest.Preset("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	spec.NetnsShared, spec.ForeignNetns = false, foreign
	if e.node, err = hcatest.Build(filepath.Join(t.TempDir(), "node"), spec); err != nil {
		t.Fatal(err)
	}
	e.cfg.AllowNonHostNetwork, e.cfg.HookPath = true, hookPath
	e.deps.hostLinks = hostLinks{}
	setInternalIPs(t, e, "10.0.0.5")
	return e
}

// hostLinks is the host's netdevs as the moveNetdev check sees them: why
// the node needs each (none when absent), or the error reading it.
type hostLinks map[string]string

func (h hostLinks) NetdevUse(name string, nodeIPs []netip.Addr) (string, error) {
	if why := h[name]; strings.HasPrefix(why, "error: ") {
		return "", errors.New(strings.TrimPrefix(why, "error: "))
	} else if strings.HasPrefix(why, "ip ") {
		// The address it holds: the node's InternalIP or not.
		ip := netip.MustParseAddr(strings.TrimPrefix(why, "ip "))
		if slices.Contains(nodeIPs, ip) {
			return "holds the node's InternalIP " + ip.String(), nil
		}
		return "", nil
	} else {
		return why, nil
	}
}

// setInternalIPs gives the Node these status.addresses of type InternalIP.
func setInternalIPs(t *testing.T, e *env, ips ...string) {
	t.Helper()
	node, err := e.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: nodeName}}
	for _, ip := range ips {
		node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	if _, err := e.client.CoreV1().Nodes().UpdateStatus(context.Background(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// setNetnsMode flips the simulated kernel's mode, as "rdma system set
// netns" does, and has the driver rescan.
func setNetnsMode(t *testing.T, e *env, shared bool) {
	t.Helper()
	v := "N"
	if shared {
		v = "Y"
	}
	if err := os.WriteFile(filepath.Join(e.node.SysfsRoot, "module/ib_core/parameters/netns_mode"), []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.drv.Rescan(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// hooks lists the createRuntime hooks' arguments of a container.
func hooks(s *oci.Spec) [][]string {
	if s.Hooks == nil {
		return nil
	}
	var out [][]string
	for _, h := range s.Hooks.CreateRuntime {
		out = append(out, h.Args)
	}
	return out
}

// The daemon reads the host's sysfs: in exclusive mode it sees every HCA
// there. From another namespace it sees none and says why.
func TestExclusiveModeDiscovery(t *testing.T) {
	t.Parallel()
	for _, foreign := range []bool{false, true} {
		e := exclusiveEnv(t, foreign)
		e.start()
		inv := e.drv.Inventory()
		if inv.NetnsMode != hca.NetnsExclusive {
			t.Errorf("foreign %v: netns mode %q, want exclusive", foreign, inv.NetnsMode)
		}
		want := 10
		if foreign {
			want = 0
		}
		if len(inv.HCAs) != want {
			t.Errorf("foreign %v: %d HCAs, want %d", foreign, len(inv.HCAs), want)
		}
		warned := slices.ContainsFunc(inv.Warnings, func(w string) bool {
			return strings.Contains(w, "in exclusive netns mode sysfs shows only the RDMA devices of the reader's network namespace")
		})
		if warned != foreign {
			t.Errorf("foreign %v: warnings %q", foreign, inv.Warnings)
		}
		if foreign {
			r := e.prepare(e.claim("far", hostNetworkPod("far", false), one("mlx5-0")))["uid-far"]
			if !strings.Contains(r.Error, "device mlx5-0 is no longer on node dgx01") {
				t.Errorf("prepare from a foreign namespace: %q", r.Error)
			}
		}
	}
}

// A pod off the host network on an exclusive-mode node gets the netns hook
// (told to move the HCA's netdevs, which it finds itself, and the node's
// InternalIPs, when HcaConfig.moveNetdev asks); a hostNetwork pod, or any
// pod on a shared-mode node, gets none.
func TestNetnsHook(t *testing.T) {
	t.Parallel()
	moveNetdev := `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","moveNetdev":true}`
	tests := []struct {
		name        string
		shared      bool // the node's netns mode
		hostNetwork bool
		device      string
		configs     []string
		want        [][]string
	}{
		{name: "own net", device: "mlx5-0",
			want: [][]string{{"rdma-dra-hook", "netns", "--device=mlx5_0"}}},
		{name: "netdev too", device: "mlx5-8", configs: []string{moveNetdev},
			want: [][]string{{"rdma-dra-hook", "netns", "--device=mlx5_8", "--move-netdevs", "--node-ip=10.0.0.5"}}},
		{name: "ipoib", device: "mlx5-1", configs: []string{moveNetdev},
			want: [][]string{{"rdma-dra-hook", "netns", "--device=mlx5_1", "--move-netdevs", "--node-ip=10.0.0.5"}}},
		{name: "hostnet", hostNetwork: true, device: "mlx5-2", configs: []string{moveNetdev}},
		{name: "shared", shared: true, device: "mlx5-3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := exclusiveEnv(t, false)
			e.start()
			if tt.shared {
				setNetnsMode(t, e, true)
			}
			// moveNetdev is the DeviceClass's to grant (policy.go).
			c := e.withClass(e.claim("c", hostNetworkPod("p", tt.hostNetwork), one(tt.device)), "hca.rdma.dra.dev", tt.configs...)
			s := e.container(e.mustPrepare(c)...)
			if diff := cmp.Diff(tt.want, hooks(s)); diff != "" {
				t.Errorf("createRuntime hooks (-want +got):\n%s", diff)
			}
			if s.Hooks == nil {
				return
			}
			for _, h := range s.Hooks.CreateRuntime {
				if h.Path != hookPath || h.Timeout == nil || *h.Timeout != 30 {
					t.Errorf("hook %s with timeout %v, want %s and 30 s", h.Path, h.Timeout, hookPath)
				}
			}
		})
	}
}

// moveNetdev never takes the node's uplink: prepare refuses a netdev that
// carries the default route or holds the Node's InternalIP, naming the
// claim, the HCA, the netdev and why; and fails closed when it cannot tell.
func TestMoveNetdevUplink(t *testing.T) {
	t.Parallel()
	moveNetdev := `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","moveNetdev":true}`
	tests := []struct {
		name        string
		links       draplugin.HostLinks // nil: the driver cannot check
		nodeIPs     []string
		hostNetwork bool
		configs     []string
		wantErr     string
	}{
		{name: "own NIC", links: hostLinks{"ens1f0np0": "ip 192.168.1.8"}, nodeIPs: []string{"10.0.0.5"}, configs: []string{moveNetdev}},
		{name: "default route", links: hostLinks{"ens1f0np0": "carries the node's default route"}, configs: []string{moveNetdev},
			wantErr: "claim default/c: device mlx5-8: refusing to move netdev ens1f0np0 of HCA mlx5_8 into the pod (moveNetdev): it carries the node's default route"},
		{name: "InternalIP", links: hostLinks{"ens1f0np0": "ip 10.0.0.5"}, nodeIPs: []string{"10.0.0.5"}, configs: []string{moveNetdev},
			wantErr: "claim default/c: device mlx5-8: refusing to move netdev ens1f0np0 of HCA mlx5_8 into the pod (moveNetdev): it holds the node's InternalIP 10.0.0.5"},
		{name: "IPv6 InternalIP", links: hostLinks{"ens1f0np0": "ip fd00::5"}, nodeIPs: []string{"10.0.0.5", "fd00::5"}, configs: []string{moveNetdev},
			wantErr: "it holds the node's InternalIP fd00::5"},
		{name: "unreadable", links: hostLinks{"ens1f0np0": "error: rtnetlink: route dump: operation not permitted"}, configs: []string{moveNetdev},
			wantErr: "HCA mlx5_8: cannot check its netdev ens1f0np0 before moving it (moveNetdev): rtnetlink: route dump: operation not permitted"},
		{name: "no check", configs: []string{moveNetdev},
			wantErr: "HCA mlx5_8: moveNetdev needs the driver to check that none of its netdevs ([ens1f0np0]) carries the node's default route"},
		{name: "not asked", links: hostLinks{"ens1f0np0": "carries the node's default route"}},
		{name: "hostnet", links: hostLinks{"ens1f0np0": "carries the node's default route"}, hostNetwork: true, configs: []string{moveNetdev}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := exclusiveEnv(t, false)
			e.deps.hostLinks = tt.links
			setInternalIPs(t, e, tt.nodeIPs...)
			e.start()
			c := e.withClass(e.claim("c", hostNetworkPod("p", tt.hostNetwork), one("mlx5-8")), "hca.rdma.dra.dev", tt.configs...)
			r := e.prepare(c)["uid-c"]
			if tt.wantErr == "" && r.Error != "" || !strings.Contains(r.Error, tt.wantErr) {
				t.Fatalf("prepare: %q, want an error containing %q", r.Error, tt.wantErr)
			}
			if tt.wantErr != "" {
				return
			}
			for _, args := range hooks(e.container(e.mustPrepare(c)...)) {
				if slices.Contains(args, "--move-netdevs") && !slices.Contains(args, "--node-ip=10.0.0.5") && len(tt.nodeIPs) > 0 {
					t.Errorf("hook %q without the node's InternalIP", args)
				}
			}
		})
	}
}

func TestExclusiveModeRefusals(t *testing.T) {
	t.Parallel()
	t.Run("shared at start", func(t *testing.T) {
		e := exclusiveEnv(t, false)
		_, err := draplugin.New(context.Background(), draplugin.Config{DriverName: driverName, NodeName: nodeName,
			HostDevRoot: e.node.DevRoot, AllowNonHostNetwork: true, Shares: 1000, HookPath: hookPath}, draplugin.Deps{
			HCAs:       hca.NewDiscoverer(hca.WithSysfsRoot(e.node.SysfsRoot), hca.WithDevRoot(e.node.DevRoot)),
			Pods:       podGetter{e.client},
			SpecDir:    cdi.NewSpecDir(e.cdiDir),
			Checkpoint: checkpoint.NewStore(e.checkpointPath()),
		})
		for _, want := range []string{"this node's RDMA subsystem is in exclusive netns mode (read from /sys/module/ib_core/parameters/netns_mode)",
			"so HCAs cannot be shared (--sharing=shared)", "rdma system set netns shared"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("starting shared on an exclusive node: %v; want it to say %q", err, want)
			}
		}
	})
	t.Run("shared hostnet", func(t *testing.T) {
		e := exclusiveEnv(t, false)
		e.cfg.Shares, e.cfg.AllowNonHostNetwork = 1000, false
		e.start() // every pod is in the initial namespace: nothing moves
		c := e.claim("h", hostNetworkPod("h", true), shared("mlx5-0", "s1"))
		// Only the hostNetwork check (policy_test.go), no move.
		want := [][]string{{"rdma-dra-hook", "hostnet", "--device=mlx5_0"}}
		if s := e.container(e.mustPrepare(c)...); !slices.EqualFunc(hooks(s), want, slices.Equal) {
			t.Errorf("hooks %q, want %q", hooks(s), want)
		}
	})
	t.Run("mixed pods", func(t *testing.T) {
		e := exclusiveEnv(t, false)
		e.start()
		c := e.claim("mixed", hostNetworkPod("a", true), one("mlx5-0"))
		b := hostNetworkPod("b", false)
		e.claim("other", b, one("mlx5-1")) // creates pod b
		c.Status.ReservedFor = append(c.Status.ReservedFor, c.Status.ReservedFor[0])
		c.Status.ReservedFor[1].Name, c.Status.ReservedFor[1].UID = b.Name, b.UID
		if _, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		r := e.prepare(c)["uid-mixed"]
		if !strings.Contains(r.Error, "reserved for pods on the host network and pods on their own, but this node's RDMA subsystem is in exclusive netns mode") {
			t.Errorf("error %q", r.Error)
		}
	})
	t.Run("lookup fails", func(t *testing.T) {
		e := exclusiveEnv(t, false)
		e.start()
		c := e.claim("ghost", nil, one("mlx5-0"))
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceRef("gone", "pod-gone"))
		if _, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if r := e.prepare(c)["uid-ghost"]; !strings.Contains(r.Error, "looking up pod default/gone") {
			t.Errorf("error %q, want the failed lookup", r.Error)
		}
	})
	t.Run("no hook", func(t *testing.T) {
		e := exclusiveEnv(t, false)
		e.cfg.HookPath = ""
		e.start()
		r := e.prepare(e.claim("c", hostNetworkPod("p", false), one("mlx5-0")))["uid-c"]
		if !strings.Contains(r.Error, "device mlx5-0 (mlx5_0) must move into the pod's network namespace") || !strings.Contains(r.Error, "--hook-path") {
			t.Errorf("error %q", r.Error)
		}
	})
}

// The mode flipping under a running daemon: shared HCAs are refused for
// pods off the host network from then on, and prepared claims' specs are
// rewritten so restarted containers get the move.
func TestNetnsModeFlips(t *testing.T) {
	t.Parallel()
	t.Run("shared", func(t *testing.T) {
		e := exclusiveEnv(t, false)
		e.cfg.Shares = 1000
		setSpecShared(t, e)
		e.deps.metrics = draplugin.NewMetrics()
		e.start()
		e.mustPrepare(e.claim("before", hostNetworkPod("before", false), shared("mlx5-0", "s1")))
		setNetnsMode(t, e, false)
		r := e.prepare(e.claim("after", hostNetworkPod("after", false), shared("mlx5-0", "s2")))["uid-after"]
		if !strings.Contains(r.Error, "device mlx5-0 (mlx5_0) is shared, but this node's RDMA subsystem is now in exclusive netns mode") {
			t.Errorf("error %q", r.Error)
		}
		e.mustPrepare(e.claim("host", hostNetworkPod("host", true), shared("mlx5-0", "s3")))
		if v := metricValue(t, e.deps.metrics, "rdma_dra_background_errors_total", "kind", "netns"); v != 1 {
			t.Errorf("background_errors_total{kind=netns} = %v, want 1", v)
		}
	})
	t.Run("whole", func(t *testing.T) {
		e := exclusiveEnv(t, false)
		setSpecShared(t, e)
		e.start()
		ids := e.mustPrepare(e.claim("c", hostNetworkPod("p", false), one("mlx5-4")))
		if h := hooks(e.container(ids...)); h != nil {
			t.Fatalf("shared mode: hooks %q", h)
		}
		setNetnsMode(t, e, false)
		want := [][]string{{"rdma-dra-hook", "netns", "--device=mlx5_4"}}
		if diff := cmp.Diff(want, hooks(e.container(ids...))); diff != "" {
			t.Errorf("after the flip (-want +got):\n%s", diff)
		}
		setNetnsMode(t, e, true)
		if h := hooks(e.container(ids...)); h != nil {
			t.Errorf("flipped back: hooks %q", h)
		}
	})
}

// hostView is the host namespace's RDMA netlink on the simulated node:
// every HCA of the spec except those a pod's namespace still holds.
type hostView struct {
	mu    sync.Mutex
	node  *hcatest.Node
	held  map[string]bool
	calls int
}

func (h *hostView) Devices() ([]rdmanl.Device, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls++
	var out []rdmanl.Device
	for i, s := range h.node.Spec.HCAs {
		if !h.held[s.Name] {
			out = append(out, rdmanl.Device{Index: uint32(i), Name: s.Name})
		}
	}
	return out, nil
}

func (h *hostView) hold(name string, held bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held[name] = held
}

// A moved HCA stays in the inventory and the slice while its pod holds
// it (the host's sysfs no longer lists it); unprepare checks it came back
// and warns, without failing, when it did not.
func TestMovedHCA(t *testing.T) {
	t.Parallel()
	e := exclusiveEnv(t, false)
	view := &hostView{node: e.node, held: map[string]bool{}}
	e.deps.hostRDMA, e.deps.metrics = view, draplugin.NewMetrics()
	e.start()
	c := e.claim("c", hostNetworkPod("p", false), one("mlx5-3"))
	e.mustPrepare(c)

	// The hook moved it: the host's class/infiniband no longer lists it.
	link := filepath.Join(e.node.SysfsRoot, "class/infiniband/mlx5_3")
	target, err := os.Readlink(link)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	view.hold("mlx5_3", true)
	if err := e.drv.Rescan(context.Background()); err != nil {
		t.Fatal(err)
	}
	inv := e.drv.Inventory()
	i := slices.IndexFunc(inv.HCAs, func(h hca.HCA) bool { return h.Name == "mlx5_3" })
	if i < 0 || !inv.HCAs[i].Usable || !slices.ContainsFunc(inv.HCAs[i].Warnings, func(w string) bool {
		return strings.Contains(w, "moved into the network namespace of the pod of claim default/c")
	}) {
		t.Fatalf("mlx5_3 after the move: %+v", inv.HCAs)
	}
	// The kubelet asks again after its restart: still preparable.
	if ids := e.mustPrepare(c); len(hooks(e.container(ids...))) != 1 {
		t.Errorf("re-prepare while moved: hooks %q", hooks(e.container(ids...)))
	}

	// The pod's namespace outlives the unprepare: a warning, success.
	r := e.unprepare(ref(c))["uid-c"]
	if r.Error != "" {
		t.Fatalf("unprepare: %s", r.Error)
	}
	e.drv.WaitReturnChecks()
	if v := metricValue(t, e.deps.metrics, "rdma_dra_netns_not_returned_total", "hca", "mlx5_3"); v != 1 {
		t.Errorf("netns_not_returned_total{hca=mlx5_3} = %v, want 1", v)
	}

	// Back in the host's namespace: nothing to say.
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	view.hold("mlx5_3", false)
	c2 := e.claim("c2", hostNetworkPod("p2", false), one("mlx5-3"))
	e.mustPrepare(c2)
	before := view.calls
	if r := e.unprepare(ref(c2))["uid-c2"]; r.Error != "" {
		t.Fatalf("unprepare: %s", r.Error)
	}
	e.drv.WaitReturnChecks()
	if v := metricValue(t, e.deps.metrics, "rdma_dra_netns_not_returned_total", "hca", "mlx5_3"); v != 1 || view.calls != before+1 {
		t.Errorf("returned HCA: counter %v (want still 1), %d checks (want 1)", v, view.calls-before)
	}
	// Unplugged while its pod held it: gone from the verbs class too, so
	// not carried over.
	c4 := e.claim("c4", hostNetworkPod("p4", false), one("mlx5-5"))
	e.mustPrepare(c4)
	if err := e.node.RemoveHCA("mlx5_5"); err != nil {
		t.Fatal(err)
	}
	if err := e.drv.Rescan(context.Background()); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(e.drv.Inventory().HCAs, func(h hca.HCA) bool { return h.Name == "mlx5_5" }) {
		t.Error("an unplugged HCA was kept as moved")
	}

	// A hostNetwork claim moved nothing: no check.
	c3 := e.claim("c3", hostNetworkPod("p3", true), one("mlx5-3"))
	e.mustPrepare(c3)
	before = view.calls
	e.unprepare(ref(c3))
	e.drv.WaitReturnChecks()
	if view.calls != before {
		t.Errorf("%d checks after a hostNetwork claim, want none", view.calls-before)
	}
}

// A daemon restarted while an HCA is moved into a pod has never seen it:
// the checkpoint's snapshot from the prepare keeps it published and its
// claim's spec rewritten, and unprepare still works.
func TestMovedHCAAcrossRestart(t *testing.T) {
	t.Parallel()
	e, view := exclusiveEnvWithView(t)
	e.start()
	c := e.claim("c", hostNetworkPod("p", false), one("mlx5-3"))
	ids := e.mustPrepare(c)
	specBefore := e.container(ids...)
	restartWhileMoved(t, e, view, "mlx5_3", nil)

	inv := e.drv.Inventory()
	i := slices.IndexFunc(inv.HCAs, func(h hca.HCA) bool { return h.Name == "mlx5_3" })
	if i < 0 || !inv.HCAs[i].Usable || inv.HCAs[i].Uverbs == nil || inv.HCAs[i].PCI == nil ||
		!slices.ContainsFunc(inv.HCAs[i].Warnings, func(w string) bool { return strings.Contains(w, "pod of claim default/c") }) {
		t.Fatalf("mlx5_3 after a restart while moved: HCAs %v", hcaNames(inv.HCAs))
	}
	if v := metricValue(t, e.deps.metrics, "rdma_dra_background_errors_total", "kind", "cdi"); v != 0 {
		t.Errorf("background_errors_total{kind=cdi} = %v after the restart: the moved HCA's spec was not rewritten", v)
	}
	if got := e.container(ids...); !reflect.DeepEqual(got.Linux.Devices, specBefore.Linux.Devices) || len(hooks(got)) != 1 {
		t.Errorf("after the restart: devices %+v, hooks %q; before: devices %+v", got.Linux.Devices, hooks(got), specBefore.Linux.Devices)
	}
	if r := e.unprepare(ref(c))["uid-c"]; r.Error != "" {
		t.Fatalf("unprepare: %s", r.Error)
	}
	// Unprepared, it is no longer carried: gone until the kernel returns it.
	if err := e.drv.Rescan(context.Background()); err != nil {
		t.Fatal(err)
	}
	if names := hcaNames(e.drv.Inventory().HCAs); slices.Contains(names, "mlx5_3") {
		t.Errorf("mlx5_3 still carried after its claim was unprepared: %v", names)
	}
}

// A snapshot that does not describe its HCA is said and counted; the HCA
// waits for its return, and the daemon starts.
func TestMovedHCABadSnapshot(t *testing.T) {
	t.Parallel()
	e, view := exclusiveEnvWithView(t)
	e.start()
	c := e.claim("c", hostNetworkPod("p", false), one("mlx5-3"))
	e.mustPrepare(c)
	restartWhileMoved(t, e, view, "mlx5_3", func(cp *checkpoint.Checkpoint) {
		cl := cp.Claims["uid-c"]
		cl.Devices[0].MovedHCA = &checkpoint.HCA{Name: "mlx5_9"}
		cp.Claims["uid-c"] = cl
	})
	if names := hcaNames(e.drv.Inventory().HCAs); slices.Contains(names, "mlx5_3") {
		t.Errorf("mlx5_3 published from a snapshot of another HCA: %v", names)
	}
	if v := metricValue(t, e.deps.metrics, "rdma_dra_background_errors_total", "kind", "checkpoint"); v != 1 {
		t.Errorf("background_errors_total{kind=checkpoint} = %v, want 1", v)
	}
	if r := e.unprepare(ref(c))["uid-c"]; r.Error != "" {
		t.Fatalf("unprepare: %s", r.Error)
	}
}

func exclusiveEnvWithView(t *testing.T) (*env, *hostView) {
	e := exclusiveEnv(t, false)
	view := &hostView{node: e.node, held: map[string]bool{}}
	e.deps.hostRDMA = view
	return e, view
}

// restartWhileMoved stops the daemon, moves ibdev out of the host's view
// as the hook would, applies edit to the checkpoint, and starts a new one.
func restartWhileMoved(t *testing.T, e *env, view *hostView, ibdev string, edit func(*checkpoint.Checkpoint)) {
	t.Helper()
	e.stop()
	if err := os.Remove(filepath.Join(e.node.SysfsRoot, "class/infiniband", ibdev)); err != nil {
		t.Fatal(err)
	}
	view.hold(ibdev, true)
	if edit != nil {
		if err := checkpoint.NewStore(e.checkpointPath()).Update(func(cp *checkpoint.Checkpoint) error { edit(cp); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	e.deps.metrics = draplugin.NewMetrics()
	e.start()
}

func hcaNames(hs []hca.HCA) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.Name)
	}
	return out
}

// setSpecShared starts the node in shared mode ("Y"), before the driver.
func setSpecShared(t *testing.T, e *env) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(e.node.SysfsRoot, "module/ib_core/parameters/netns_mode"), []byte("Y\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func resourceRef(name, uid string) resourceapi.ResourceClaimConsumerReference {
	return resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: name, UID: types.UID(uid)}
}

// metricValue reads one counter from the driver's registry: the one with
// label=value, or with label "" the unlabelled one.
func metricValue(t *testing.T, m *draplugin.Metrics, name, label, value string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, metric := range f.GetMetric() {
			if label == "" {
				return metric.GetCounter().GetValue()
			}
			for _, l := range metric.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return metric.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
