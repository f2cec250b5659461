package hca_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

func build(t testing.TB, spec hcatest.Spec) *hcatest.Node {
	t.Helper()
	n, err := hcatest.Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func preset(t testing.TB, name string) *hcatest.Node {
	t.Helper()
	spec, err := hcatest.Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	return build(t, spec)
}

func discover(t testing.TB, n *hcatest.Node) hca.Inventory {
	t.Helper()
	inv, err := hca.Discover(hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot), hca.WithReadFile(n.ReadFile))
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// row is the summary of one HCA that rdmactl's table shows, plus the facts
// the attribute contract needs.
func row(h hca.HCA) string {
	p := h.Ports[0]
	numa, root, sriov := -2, "", ""
	if h.PCI != nil {
		numa, root, sriov = h.PCI.NUMANode, h.PCI.PCIeRoot, string(h.PCI.SRIOV)
	}
	uverbs := "-"
	if h.Uverbs != nil {
		uverbs = fmt.Sprintf("%s=%d:%d", h.Uverbs.Name, h.Uverbs.Major, h.Uverbs.Minor)
	}
	return fmt.Sprintf("%s %s %s %s %g %s/%s numa=%d root=%s netdevs=%s %s sriov=%s roce=%d lid=%d usable=%v",
		h.Name, h.Model, h.Transport(), p.LinkLayer, p.RateGbps, p.State, p.PhysState, numa, root,
		strings.Join(h.Netdevs, ","), uverbs, sriov, p.RoCEv2GIDIndex, p.LID, h.Usable)
}

func TestDiscoverPresets(t *testing.T) {
	tests := []struct {
		preset string
		netns  hca.NetnsMode
		rdmaCM string
		rows   []string
	}{
		{
			preset: "dgx-h100", netns: hca.NetnsShared, rdmaCM: "10:58",
			rows: []string{
				"mlx5_0 ConnectX-7 ib InfiniBand 400 ACTIVE/LinkUp numa=0 root=pci0000:15 netdevs=ibp22s0 uverbs0=231:192 sriov= roce=-1 lid=26 usable=true",
				"mlx5_1 ConnectX-7 ib InfiniBand 400 ACTIVE/LinkUp numa=0 root=pci0000:15 netdevs=ibp23s0 uverbs1=231:193 sriov= roce=-1 lid=27 usable=true",
				"mlx5_2 ConnectX-7 ib InfiniBand 400 ACTIVE/LinkUp numa=0 root=pci0000:3e netdevs=ibp63s0 uverbs2=231:194 sriov= roce=-1 lid=28 usable=true",
				"mlx5_3 ConnectX-7 ib InfiniBand 400 ACTIVE/LinkUp numa=0 root=pci0000:3e netdevs=ibp64s0 uverbs3=231:195 sriov= roce=-1 lid=29 usable=true",
				"mlx5_4 ConnectX-7 ib InfiniBand 400 ACTIVE/LinkUp numa=1 root=pci0000:9a netdevs=ibp155s0 uverbs4=231:196 sriov= roce=-1 lid=30 usable=true",
				"mlx5_5 ConnectX-7 ib InfiniBand 400 ACTIVE/LinkUp numa=1 root=pci0000:9a netdevs=ibp156s0 uverbs5=231:197 sriov= roce=-1 lid=31 usable=true",
				"mlx5_6 ConnectX-7 ib InfiniBand 400 ACTIVE/LinkUp numa=1 root=pci0000:c0 netdevs=ibp193s0 uverbs6=231:198 sriov= roce=-1 lid=32 usable=true",
				"mlx5_7 ConnectX-7 ib InfiniBand 400 ACTIVE/LinkUp numa=1 root=pci0000:c0 netdevs=ibp194s0 uverbs7=231:199 sriov= roce=-1 lid=33 usable=true",
				"mlx5_8 BlueField-3 roce Ethernet 200 ACTIVE/LinkUp numa=1 root=pci0000:d0 netdevs=ens1f0np0 uverbs8=231:200 sriov= roce=3 lid=0 usable=true",
				"mlx5_9 BlueField-3 roce Ethernet 200 ACTIVE/LinkUp numa=1 root=pci0000:d0 netdevs=ens1f1np1 uverbs9=231:201 sriov= roce=3 lid=0 usable=true",
			},
		},
		{
			preset: "roce-sriov", netns: hca.NetnsExclusive, rdmaCM: "10:59",
			rows: []string{
				"mlx5_0 ConnectX-6 Dx roce Ethernet 100 ACTIVE/LinkUp numa=0 root=pci0000:3a netdevs=enp59s0f0np0 uverbs0=231:192 sriov=PF roce=3 lid=0 usable=true",
				"mlx5_1 ConnectX-6 Dx roce Ethernet 40 DOWN/Disabled numa=0 root=pci0000:3a netdevs=enp59s0f1np1 uverbs1=231:193 sriov=PF roce=-1 lid=0 usable=true",
				"mlx5_2 ConnectX VF roce Ethernet 100 ACTIVE/LinkUp numa=0 root=pci0000:3a netdevs=enp59s0f0v0 uverbs2=231:194 sriov=VF roce=3 lid=0 usable=true",
				"mlx5_3 ConnectX VF roce Ethernet 100 ACTIVE/LinkUp numa=0 root=pci0000:3a netdevs=enp59s0f0v1 uverbs3=231:195 sriov=VF roce=3 lid=0 usable=true",
				"mlx5_4 ConnectX VF roce Ethernet 100 ACTIVE/LinkUp numa=0 root=pci0000:3a netdevs=enp59s0f0v2 uverbs4=231:196 sriov=VF roce=3 lid=0 usable=true",
				"mlx5_5 ConnectX VF roce Ethernet 100 ACTIVE/LinkUp numa=0 root=pci0000:3a netdevs=enp59s0f0v3 uverbs5=231:197 sriov=VF roce=3 lid=0 usable=true",
			},
		},
		{
			preset: "softroce", netns: hca.NetnsShared, rdmaCM: "10:122",
			rows: []string{
				"rxe0 Soft-RoCE roce Ethernet 2.5 ACTIVE/LinkUp numa=-2 root= netdevs=eth0 uverbs0=231:192 sriov= roce=1 lid=0 usable=true",
			},
		},
		{preset: "empty", netns: hca.NetnsShared},
	}
	for _, tt := range tests {
		t.Run(tt.preset, func(t *testing.T) {
			inv := discover(t, preset(t, tt.preset))
			if inv.NetnsMode != tt.netns {
				t.Errorf("netns mode = %q, want %q", inv.NetnsMode, tt.netns)
			}
			gotCM := ""
			if inv.RDMACM != nil {
				gotCM = fmt.Sprintf("%d:%d", inv.RDMACM.Major, inv.RDMACM.Minor)
				if !inv.RDMACM.Exists {
					t.Errorf("rdma_cm node not found under the dev root")
				}
			}
			if gotCM != tt.rdmaCM {
				t.Errorf("rdma_cm = %q, want %q", gotCM, tt.rdmaCM)
			}
			if len(inv.HCAs) != len(tt.rows) {
				t.Fatalf("got %d HCAs, want %d", len(inv.HCAs), len(tt.rows))
			}
			for i, h := range inv.HCAs {
				if got := row(h); got != tt.rows[i] {
					t.Errorf("HCA %d:\n got %s\nwant %s", i, got, tt.rows[i])
				}
				if len(h.Warnings) > 0 {
					t.Errorf("%s: unexpected warnings %q", h.Name, h.Warnings)
				}
			}
			if len(inv.Warnings) > 0 {
				t.Errorf("unexpected node warnings %q", inv.Warnings)
			}
		})
	}
}

func TestDiscoverDGXDetails(t *testing.T) {
	inv := discover(t, preset(t, "dgx-h100"))
	h := inv.HCAs[0]
	if h.FirmwareVer != "28.39.2048" || h.HCAType != "MT4129" || h.NodeGUID != "a088:c203:0012:3a40" || h.NodeType != "CA" {
		t.Errorf("mlx5_0 identity = fw %q type %q guid %q node type %q", h.FirmwareVer, h.HCAType, h.NodeGUID, h.NodeType)
	}
	if h.PCI.BusID != "0000:16:00.0" || h.PCI.VendorID != "15b3" || h.PCI.DeviceID != "1021" || h.PCI.Driver != "mlx5_core" {
		t.Errorf("mlx5_0 PCI = %+v", *h.PCI)
	}
	if p := h.Ports[0]; p.Width != "4X" || p.Speed != "NDR" || p.SMLID != 1 || len(p.GIDs) != 1 || p.GIDs[0].Netdev != "" {
		t.Errorf("mlx5_0 port = %+v", p)
	}
	var mads []string
	for _, m := range h.MAD {
		mads = append(mads, fmt.Sprintf("%s=%d:%d/port%d/%v", m.Name, m.Major, m.Minor, m.Port, m.Exists))
	}
	if got, want := strings.Join(mads, " "), "issm0=231:64/port1/true umad0=231:0/port1/true"; got != want {
		t.Errorf("mlx5_0 MAD devices = %s, want %s", got, want)
	}
	bf := inv.HCAs[8]
	if g := bf.Ports[0].GIDs[3]; g.Type != "RoCE v2" || g.Netdev != "ens1f0np0" || g.GID != "0000:0000:0000:0000:0000:ffff:0a00:0001" {
		t.Errorf("mlx5_8 GID 3 = %+v", g)
	}
}

func TestDiscoverBrokenNode(t *testing.T) {
	n := preset(t, "broken")
	inv := discover(t, n)
	if len(inv.HCAs) != 6 {
		t.Fatalf("got %d HCAs, want all 6 despite the damage", len(inv.HCAs))
	}
	byName := map[string]hca.HCA{}
	for _, h := range inv.HCAs {
		byName[h.Name] = h
	}
	tests := []struct {
		ibdev    string
		warning  string // substring of the one expected warning; "" = none
		usable   bool
		mustFail string // substring of UnusableReason
	}{
		{ibdev: "mlx5_0", usable: true},
		{ibdev: "mlx5_1", warning: "ports/1/rate: cannot parse \"fast\"", usable: true},
		{ibdev: "mlx5_2", warning: "ports/1/state: cannot parse \"banana\"", usable: true},
		{ibdev: "mlx5_3", warning: "fw_ver: no such file or directory", usable: true},
		{ibdev: "mlx5_4", mustFail: "no uverbs device"},
		{ibdev: "mlx5_5", warning: "numa_node: cannot parse \"x\"", usable: true},
	}
	for _, tt := range tests {
		h := byName[tt.ibdev]
		switch {
		case tt.warning == "" && len(h.Warnings) > 0:
			t.Errorf("%s: unexpected warnings %q", tt.ibdev, h.Warnings)
		case tt.warning != "" && (len(h.Warnings) != 1 || !strings.Contains(h.Warnings[0], tt.warning)):
			t.Errorf("%s: warnings %q, want one containing %q", tt.ibdev, h.Warnings, tt.warning)
		case tt.warning != "" && !strings.HasPrefix(h.Warnings[0], n.SysfsRoot+"/"):
			t.Errorf("%s: warning %q does not name the file by its full path", tt.ibdev, h.Warnings[0])
		}
		if h.Usable != tt.usable || !strings.Contains(h.UnusableReason, tt.mustFail) {
			t.Errorf("%s: usable=%v reason=%q, want usable=%v reason containing %q", tt.ibdev, h.Usable, h.UnusableReason, tt.usable, tt.mustFail)
		}
	}
	if s := byName["mlx5_2"].Ports[0].State; s != "" {
		t.Errorf("garbled state parsed as %q, want empty (not ACTIVE)", s)
	}
	if byName["mlx5_2"].AnyPortActive() {
		t.Error("an HCA with a garbled port state counts as active")
	}
}

func TestDiscoverMissingDevNode(t *testing.T) {
	spec, _ := hcatest.Preset("dgx-h100")
	n := build(t, spec)
	if err := removeDevNode(n, "uverbs3"); err != nil {
		t.Fatal(err)
	}
	inv := discover(t, n)
	h := inv.HCAs[3]
	if h.Usable || !strings.Contains(h.UnusableReason, "/dev/infiniband/uverbs3 is missing") {
		t.Errorf("mlx5_3 without its dev node: usable=%v reason=%q", h.Usable, h.UnusableReason)
	}
}

// A verbs device number the kernel never allocates, or a /dev node that
// contradicts it, would be published and then fail every prepare (and, on
// the device-plugin route, the node-wide edits): the HCA is unusable, the
// file at fault named, and the HCAs next to it are untouched.
func TestDiscoverBadUverbsDevice(t *testing.T) {
	tests := []struct {
		name     string
		dev      string        // written to mlx5_3's uverbs3/dev; "" = left alone
		fault    syscall.Errno // reading uverbs3/dev fails so
		node     func(path string) error
		needRoot bool   // node makes a device node
		reason   string // %[1]s is the sysfs root, %[2]s the dev root
	}{
		{
			name: "major 0", dev: "0:195",
			reason: `%[1]s/class/infiniband_verbs/uverbs3/dev: major 0 in "0:195" is not a device the kernel allocates`,
		},
		{
			name: "major beyond 12 bits", dev: "4096:195",
			reason: `%[1]s/class/infiniband_verbs/uverbs3/dev: major 4096 in "4096:195" is not a device the kernel allocates (majors end at 4095)`,
		},
		{
			name: "minor beyond 20 bits", dev: "231:1048576",
			reason: `%[1]s/class/infiniband_verbs/uverbs3/dev: minor 1048576 in "231:1048576" is not a device the kernel allocates (minors end at 1048575)`,
		},
		{
			name: "garbled", dev: "231-195",
			reason: `%[1]s/class/infiniband_verbs/uverbs3/dev: cannot parse "231-195": want "<major>:<minor>"`,
		},
		{
			name: "unreadable", fault: syscall.EIO,
			reason: `%[1]s/class/infiniband_verbs/uverbs3/dev: input/output error`,
		},
		{
			name: "node is a directory", node: func(p string) error { return mkdirMode(p, 0o755) },
			reason: `%[2]s/infiniband/uverbs3 is not a character device (mode drwxr-xr-x)`,
		},
		{
			name: "node is a block device", needRoot: true, node: mknod(unix.S_IFBLK, 231, 195),
			reason: `%[2]s/infiniband/uverbs3 is not a character device (mode Drw-rw-rw-)`,
		},
		{
			name: "node has another number", needRoot: true, node: mknod(unix.S_IFCHR, 231, 196),
			reason: `%[2]s/infiniband/uverbs3 is character device 231:196, but %[1]s/class/infiniband_verbs/uverbs3/dev says "231:195"`,
		},
		{
			name: "node has major 0", needRoot: true, node: mknod(unix.S_IFCHR, 0, 195),
			reason: `%[2]s/infiniband/uverbs3 is character device 0:195, but %[1]s/class/infiniband_verbs/uverbs3/dev says "231:195"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.needRoot && os.Geteuid() != 0 {
				t.Skip("not root: cannot make device nodes")
			}
			spec, _ := hcatest.Preset("dgx-h100")
			if tt.dev != "" {
				spec.HCAs[3].Corrupt = map[string]string{"pci:infiniband_verbs/uverbs3/dev": tt.dev}
			}
			n := build(t, spec)
			if tt.fault != 0 {
				n.Faults[filepath.Join(n.PCIDir("mlx5_3"), "infiniband_verbs", "uverbs3", "dev")] = tt.fault
			}
			if tt.node != nil {
				path := filepath.Join(n.DevRoot, "infiniband", "uverbs3")
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				if err := tt.node(path); err != nil {
					t.Fatal(err)
				}
			}
			inv := discover(t, n)
			want := fmt.Sprintf(tt.reason, realPath(t, n.SysfsRoot), n.DevRoot)
			if len(inv.HCAs) != 10 {
				t.Fatalf("got %d HCAs, want all 10", len(inv.HCAs))
			}
			for _, h := range inv.HCAs {
				if len(h.Warnings) > 0 {
					t.Errorf("%s: unexpected warnings %q", h.Name, h.Warnings)
				}
				if h.Name != "mlx5_3" {
					if !h.Usable || h.Uverbs == nil {
						t.Errorf("%s next to the bad one: usable=%v reason=%q, want usable", h.Name, h.Usable, h.UnusableReason)
					}
					continue
				}
				if h.Usable || h.UnusableReason != want || h.Problem() != want {
					t.Errorf("mlx5_3: usable=%v reason=%q\nwant unusable, reason %q", h.Usable, h.UnusableReason, want)
				}
				if h.Uverbs != nil {
					t.Errorf("mlx5_3: rejected verbs device kept as %+v", *h.Uverbs)
				}
			}
			if len(inv.Warnings) > 0 {
				t.Errorf("unexpected node warnings %q (the reason is on the HCA)", inv.Warnings)
			}
		})
	}
}

// A bad rdma_cm is left out of the inventory (every container would get
// it) and a bad MAD device is left off its HCA, each with a node warning
// naming the file; every HCA stays usable.
func TestDiscoverBadNodeWideDevices(t *testing.T) {
	tests := []struct {
		name     string
		sysfs    map[string]string // relative to the sysfs root => content
		node     string            // name under dev/infiniband replaced by makeNode
		makeNode func(path string) error
		needRoot bool
		rdmaCM   bool     // whether rdma_cm stays in the inventory
		mad3     string   // mlx5_3's MAD devices
		warnings []string // %[1]s is the sysfs root, %[2]s the dev root
	}{
		{
			name: "rdma_cm major 0", sysfs: map[string]string{"class/misc/rdma_cm/dev": "0:58"},
			mad3: "issm3 umad3",
			warnings: []string{
				`%[1]s/class/misc/rdma_cm/dev: major 0 in "0:58" is not a device the kernel allocates; rdma_cm is left out of the inventory`,
			},
		},
		{
			name: "rdma_cm garbled", sysfs: map[string]string{"class/misc/rdma_cm/dev": "ten:58"},
			mad3: "issm3 umad3",
			warnings: []string{
				`%[1]s/class/misc/rdma_cm/dev: cannot parse "ten:58": want "<major>:<minor>"; rdma_cm is left out of the inventory`,
			},
		},
		{
			name: "rdma_cm node has another number", node: "rdma_cm", makeNode: mknod(unix.S_IFCHR, 10, 59), needRoot: true,
			mad3: "issm3 umad3",
			warnings: []string{
				`%[2]s/infiniband/rdma_cm is character device 10:59, but %[1]s/class/misc/rdma_cm/dev says "10:58"; rdma_cm is left out of the inventory`,
			},
		},
		{
			name: "umad major 0", sysfs: map[string]string{"class/infiniband_mad/umad3/dev": "0:3"},
			rdmaCM: true, mad3: "issm3",
			warnings: []string{
				`%[1]s/class/infiniband_mad/umad3/dev: major 0 in "0:3" is not a device the kernel allocates`,
			},
		},
		{
			name: "issm node is a directory", node: "issm3", makeNode: func(p string) error { return mkdirMode(p, 0o755) },
			rdmaCM: true, mad3: "umad3",
			warnings: []string{`%[2]s/infiniband/issm3 is not a character device (mode drwxr-xr-x)`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.needRoot && os.Geteuid() != 0 {
				t.Skip("not root: cannot make device nodes")
			}
			n := preset(t, "dgx-h100")
			for rel, content := range tt.sysfs {
				if err := os.WriteFile(filepath.Join(n.SysfsRoot, rel), []byte(content+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tt.makeNode != nil {
				path := filepath.Join(n.DevRoot, "infiniband", tt.node)
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				if err := tt.makeNode(path); err != nil {
					t.Fatal(err)
				}
			}
			inv := discover(t, n)
			sys := realPath(t, n.SysfsRoot)
			var want []string
			for _, w := range tt.warnings {
				want = append(want, fmt.Sprintf(w, sys, n.DevRoot))
			}
			if !slices.Equal(inv.Warnings, want) {
				t.Errorf("node warnings:\n got %q\nwant %q", inv.Warnings, want)
			}
			if (inv.RDMACM != nil) != tt.rdmaCM {
				t.Errorf("rdma_cm in the inventory: %v, want %v", inv.RDMACM != nil, tt.rdmaCM)
			}
			for _, h := range inv.HCAs {
				if !h.Usable || len(h.Warnings) > 0 {
					t.Errorf("%s: usable=%v reason=%q warnings=%q, want usable without warnings", h.Name, h.Usable, h.UnusableReason, h.Warnings)
				}
				if h.Name != "mlx5_3" {
					continue
				}
				var mads []string
				for _, m := range h.MAD {
					mads = append(mads, m.Name)
				}
				if got := strings.Join(mads, " "); got != tt.mad3 {
					t.Errorf("mlx5_3 MAD devices = %q, want %q", got, tt.mad3)
				}
			}
		})
	}
}

func TestDiscoverNoSysfs(t *testing.T) {
	if _, err := hca.Discover(hca.WithSysfsRoot(t.TempDir() + "/nope")); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing sysfs root: err = %v, want one naming the path", err)
	}
	inv, err := hca.Discover(hca.WithSysfsRoot(t.TempDir()))
	if err != nil || len(inv.HCAs) != 0 {
		t.Errorf("sysfs without the RDMA class: %d HCAs, err %v; want an empty inventory", len(inv.HCAs), err)
	}
}

// BenchmarkDiscover is the periodic rescan: after the first (full) pass,
// what changes without a kernel event is read again (cpu-ms/op: getrusage).
func BenchmarkDiscover(b *testing.B) { benchDiscover(b) }

// BenchmarkDiscoverFull is a full pass every time: the first discovery,
// one after a kernel event, and one per full rescan interval.
func BenchmarkDiscoverFull(b *testing.B) { benchDiscover(b, hca.WithFullRescanInterval(0)) }

// benchDiscover times Discover on one Discoverer, as the daemon's rescans
// call it: BenchmarkDiscover is the periodic rescan (what changes silently
// re-read), BenchmarkDiscoverFull a full pass.
func benchDiscover(b *testing.B, opts ...hca.Option) {
	dgx, _ := hcatest.Preset("dgx-h100")
	rxe, _ := hcatest.Preset("rxe") // 1024 GID slots, 2 used
	for _, bc := range []struct {
		name string
		spec hcatest.Spec
	}{{"dgx-h100", dgx}, {"synthetic-64", hcatest.Synthetic(64)}, {"rxe", rxe}} {
		b.Run(bc.name, func(b *testing.B) {
			n := build(b, bc.spec)
			d := hca.NewDiscoverer(append([]hca.Option{hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot)}, opts...)...)
			// The daemon's first discovery, at start: a full pass.
			if _, err := d.Discover(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			start := cpuTime(b)
			for b.Loop() {
				if _, err := d.Discover(); err != nil {
					b.Fatal(err)
				}
			}
			// Discovery walks the HCAs on up to 4 goroutines: CPU time
			// can exceed the wall time of ns/op.
			b.ReportMetric(float64(cpuTime(b)-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
		})
	}
}

func removeDevNode(n *hcatest.Node, name string) error {
	return os.Remove(filepath.Join(n.DevRoot, "infiniband", name))
}

// realPath is path with symlinks resolved, as discovery names sysfs files.
func realPath(t *testing.T, path string) string {
	t.Helper()
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mkdirMode makes a directory of exactly mode, whatever the umask.
func mkdirMode(path string, mode os.FileMode) error {
	if err := os.Mkdir(path, mode); err != nil {
		return err
	}
	return os.Chmod(path, mode)
}

// mknod returns a maker of a device node of type typ (unix.S_IFCHR or
// unix.S_IFBLK) and number major:minor, mode 0666 whatever the umask.
func mknod(typ uint32, major, minor uint32) func(string) error {
	return func(path string) error {
		if err := unix.Mknod(path, typ|0o666, int(unix.Mkdev(major, minor))); err != nil {
			return &os.PathError{Op: "mknod", Path: path, Err: err}
		}
		return os.Chmod(path, 0o666)
	}
}
