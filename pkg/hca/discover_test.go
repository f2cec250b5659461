package hca_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
				"rxe0 Soft-RoCE roce Ethernet 2.5 ACTIVE/LinkUp numa=-2 root= netdevs=eth0 uverbs0=231:192 sriov= roce=3 lid=0 usable=true",
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

func TestDiscoverNoSysfs(t *testing.T) {
	if _, err := hca.Discover(hca.WithSysfsRoot(t.TempDir() + "/nope")); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing sysfs root: err = %v, want one naming the path", err)
	}
	inv, err := hca.Discover(hca.WithSysfsRoot(t.TempDir()))
	if err != nil || len(inv.HCAs) != 0 {
		t.Errorf("sysfs without the RDMA class: %d HCAs, err %v; want an empty inventory", len(inv.HCAs), err)
	}
}

func BenchmarkDiscover(b *testing.B) {
	dgx, _ := hcatest.Preset("dgx-h100")
	for _, bc := range []struct {
		name string
		spec hcatest.Spec
	}{{"dgx-h100", dgx}, {"synthetic-64", hcatest.Synthetic(64)}} {
		b.Run(bc.name, func(b *testing.B) {
			n := build(b, bc.spec)
			d := hca.NewDiscoverer(hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.Discover(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func removeDevNode(n *hcatest.Node, name string) error {
	return os.Remove(filepath.Join(n.DevRoot, "infiniband", name))
}
