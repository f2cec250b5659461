package hca_test

import (
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// softHCA is what discovery should make of the rxe and siw presets (the
// test/vm guest's layout) from sysfs alone.
func softHCA(name string) hca.HCA {
	uverbs := &hca.CharDevice{Name: "uverbs0", Path: "/dev/infiniband/uverbs0", Major: 231, Minor: 192, Exists: true}
	port := hca.Port{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: hca.LinkLayerEthernet,
		RateGbps: 2.5, Width: "1X", Speed: "SDR"}
	if name == "rxe0" {
		port.GIDs = []hca.GID{
			{Index: 0, GID: "fe80:0000:0000:0000:5054:00ff:fe12:3456", Type: "RoCE v2", Netdev: "eth0"},
			{Index: 1, GID: "0000:0000:0000:0000:0000:ffff:0a00:020f", Type: "RoCE v2", Netdev: "eth0"},
		}
		port.RoCEv2GIDIndex = 1
		mad := func(name string, minor uint32) hca.CharDevice {
			return hca.CharDevice{Name: name, Path: "/dev/infiniband/" + name, Major: 231, Minor: minor, Port: 1, Exists: true}
		}
		return hca.HCA{Identity: hca.Identity{NodeType: "CA", NodeGUID: "5054:00ff:fe12:3456", SysImageGUID: "5054:00ff:fe12:3456", NodeDesc: "rxe", Model: "Soft-RoCE"}, Name: name,
			Ports: []hca.Port{port}, Uverbs: uverbs,
			MAD:     []hca.CharDevice{mad("issm0", 64), mad("umad0", 0)},
			Netdevs: []string{"eth0"}, Software: true, ParentNetdev: "eth0", Usable: true}
	}
	port.GIDs = []hca.GID{{Index: 0, GID: "5254:0012:3456:0000:0000:0000:0000:0000", Type: "IB/RoCE v1"}}
	port.RoCEv2GIDIndex = -1
	return hca.HCA{Identity: hca.Identity{NodeType: "RNIC", NodeGUID: "5054:00ff:fe12:3456", SysImageGUID: "5054:00ff:fe12:3456", NodeDesc: "Software iWARP stack", Model: "soft-iWARP"}, Name: name,
		Ports: []hca.Port{port}, Uverbs: uverbs,
		Software: true, Usable: true}
}

func withPortNetdev(h hca.HCA, nd string) hca.HCA {
	h.Ports = append([]hca.Port(nil), h.Ports...)
	h.Ports[0].Netdev = nd
	h.Netdevs = []string{nd}
	h.ParentNetdev = nd
	return h
}

// fakeNetlink answers with fixed values, for cases no simulated node makes.
type fakeNetlink struct {
	mode  rdmanl.NetnsMode
	links []rdmanl.Port
}

func (f fakeNetlink) NetnsMode() (rdmanl.NetnsMode, error) { return f.mode, nil }
func (f fakeNetlink) Links() ([]rdmanl.Port, error)        { return f.links, nil }

func TestDiscoverSoftware(t *testing.T) {
	refused := func(n *hcatest.Node) hca.Netlink {
		nl := n.Netlink()
		nl.Err = &rdmanl.Error{Op: "system query", Err: syscall.EOPNOTSUPP}
		return nl
	}
	tests := []struct {
		name       string
		preset     string
		edit       func(*hcatest.Spec)
		netlink    func(*hcatest.Node) hca.Netlink // nil: sysfs only
		want       []hca.HCA
		wantMode   hca.NetnsMode
		wantSource hca.Source
		wantWarn   []string
		wantHidden []string
	}{
		{
			name: "rxe, sysfs only", preset: "rxe",
			want: []hca.HCA{softHCA("rxe0")}, wantMode: hca.NetnsShared, wantSource: hca.SourceSysfs,
		},
		{
			name: "rxe with netlink", preset: "rxe",
			netlink: func(n *hcatest.Node) hca.Netlink { return n.Netlink() },
			want:    []hca.HCA{withPortNetdev(softHCA("rxe0"), "eth0")}, wantMode: hca.NetnsShared, wantSource: hca.SourceNetlink,
		},
		{
			name: "siw, sysfs only: no netdev anywhere", preset: "siw",
			want: []hca.HCA{softHCA("siw0")}, wantMode: hca.NetnsShared, wantSource: hca.SourceSysfs,
		},
		{
			name: "siw with netlink: its netdev", preset: "siw",
			netlink: func(n *hcatest.Node) hca.Netlink { return n.Netlink() },
			want:    []hca.HCA{withPortNetdev(softHCA("siw0"), "eth0")}, wantMode: hca.NetnsShared, wantSource: hca.SourceNetlink,
		},
		{
			name: "netlink refuses: sysfs values and a warning", preset: "siw",
			netlink: refused,
			want:    []hca.HCA{softHCA("siw0")}, wantMode: hca.NetnsShared, wantSource: hca.SourceSysfs,
			wantWarn: []string{
				"rdma netlink: system query: operation not supported; netns mode from sysfs",
				"rdma netlink: system query: operation not supported; netdevs from sysfs only",
			},
		},
		{
			name: "netlink's netns mode wins", preset: "rxe",
			netlink: func(*hcatest.Node) hca.Netlink { return fakeNetlink{mode: rdmanl.NetnsExclusive} },
			want:    []hca.HCA{softHCA("rxe0")}, wantMode: hca.NetnsExclusive, wantSource: hca.SourceNetlink,
		},
		{
			name: "netlink ports of devices sysfs lacks are ignored", preset: "siw",
			netlink: func(*hcatest.Node) hca.Netlink {
				return fakeNetlink{mode: rdmanl.NetnsShared, links: []rdmanl.Port{
					{DevName: "siw1", Index: 1, Netdev: "eth1"}, {DevName: "siw0", Index: 7, Netdev: "eth0"}}}
			},
			// A port number sysfs does not have still names the device's netdev.
			want: []hca.HCA{func() hca.HCA {
				h := softHCA("siw0")
				h.Netdevs, h.ParentNetdev = []string{"eth0"}, "eth0"
				return h
			}()},
			wantMode: hca.NetnsShared, wantSource: hca.SourceNetlink,
		},
		{
			name: "exclusive mode seen from the host: every device", preset: "rxe",
			edit:    func(s *hcatest.Spec) { s.NetnsShared = false },
			netlink: func(n *hcatest.Node) hca.Netlink { return n.Netlink() },
			want:    []hca.HCA{withPortNetdev(softHCA("rxe0"), "eth0")}, wantMode: hca.NetnsExclusive, wantSource: hca.SourceNetlink,
		},
		{
			name: "exclusive mode seen from a pod's namespace: none, and why", preset: "rxe",
			edit:     func(s *hcatest.Spec) { s.NetnsShared, s.ForeignNetns = false, true },
			netlink:  func(n *hcatest.Node) hca.Netlink { return n.Netlink() },
			wantMode: hca.NetnsExclusive, wantSource: hca.SourceNetlink, wantHidden: []string{"rxe0"},
			wantWarn: []string{"class/infiniband does not list rxe0, which class/infiniband_verbs names: in exclusive netns mode " +
				"sysfs shows only the RDMA devices of the reader's network namespace; run in the host's (hostNetwork)"},
		},
		{
			name: "shared mode seen from a pod's namespace: every device, netdevs from sysfs", preset: "rxe",
			edit:    func(s *hcatest.Spec) { s.ForeignNetns = true },
			netlink: func(n *hcatest.Node) hca.Netlink { return n.Netlink() },
			want:    []hca.HCA{softHCA("rxe0")}, wantMode: hca.NetnsShared, wantSource: hca.SourceNetlink,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := hcatest.Preset(tt.preset)
			if err != nil {
				t.Fatal(err)
			}
			if tt.edit != nil {
				tt.edit(&spec)
			}
			n := build(t, spec)
			opts := []hca.Option{hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot), hca.WithReadFile(n.ReadFile)}
			if tt.netlink != nil {
				opts = append(opts, hca.WithNetlink(tt.netlink(n)))
			}
			inv, err := hca.Discover(opts...)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, inv.HCAs); diff != "" {
				t.Errorf("HCAs (-want +got):\n%s", diff)
			}
			if inv.NetnsMode != tt.wantMode || inv.NetnsModeSource != tt.wantSource {
				t.Errorf("netns mode %q from %q, want %q from %q", inv.NetnsMode, inv.NetnsModeSource, tt.wantMode, tt.wantSource)
			}
			if diff := cmp.Diff(tt.wantWarn, inv.Warnings); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantHidden, inv.Hidden); diff != "" {
				t.Errorf("hidden ibdevs (-want +got):\n%s", diff)
			}
			if inv.RDMACM == nil || inv.RDMACM.Minor != 124 {
				t.Errorf("rdma_cm = %+v, want 10:124", inv.RDMACM)
			}
		})
	}
}

// The netlink fake reports what the kernel would for hardware too: an
// Ethernet function's netdev, none for InfiniBand, and netdevs follow a
// rename.
func TestDiscoverHardwareWithNetlink(t *testing.T) {
	n := preset(t, "dgx-h100")
	if err := n.RenameNetdev("ens1f0np0", "roce0"); err != nil {
		t.Fatal(err)
	}
	inv, err := hca.Discover(hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot), hca.WithReadFile(n.ReadFile),
		hca.WithNetlink(n.Netlink()))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range inv.HCAs {
		got = append(got, h.Name+"="+h.Ports[0].Netdev+"/"+strings.Join(h.Netdevs, ","))
		if len(h.Warnings) > 0 {
			t.Errorf("%s: %q", h.Name, h.Warnings)
		}
	}
	want := "mlx5_0=/ibp22s0 mlx5_1=/ibp23s0 mlx5_2=/ibp63s0 mlx5_3=/ibp64s0 mlx5_4=/ibp155s0 mlx5_5=/ibp156s0 " +
		"mlx5_6=/ibp193s0 mlx5_7=/ibp194s0 mlx5_8=roce0/roce0 mlx5_9=ens1f1np1/ens1f1np1"
	if strings.Join(got, " ") != want {
		t.Errorf("port netdev/netdevs:\n got %s\nwant %s", strings.Join(got, " "), want)
	}
}

func TestHostNetlink(t *testing.T) {
	if nl := hca.HostNetlink(t.TempDir()); nl != nil {
		t.Errorf("a simulated tree got the host's netlink: %T", nl)
	}
	if _, ok := hca.HostNetlink("/sys").(rdmanl.Client); !ok {
		t.Errorf("/sys did not get the kernel's RDMA netlink")
	}
}

// TestDiscoverVMPreset: the whole test/vm guest (rxe0, rxe1, siw0), with and
// without netlink.
func TestDiscoverVMPreset(t *testing.T) {
	for _, tt := range []struct {
		name    string
		netlink bool
		want    string
	}{
		{"sysfs only", false,
			"rxe0 parent=eth0 netdevs=eth0 port=- uverbs0 mad=2 roce=1|rxe1 parent=eth1 netdevs=eth1 port=- uverbs1 mad=2 roce=1|" +
				"siw0 parent=- netdevs=- port=- uverbs2 mad=0 roce=-1"},
		{"with netlink", true,
			"rxe0 parent=eth0 netdevs=eth0 port=eth0 uverbs0 mad=2 roce=1|rxe1 parent=eth1 netdevs=eth1 port=eth1 uverbs1 mad=2 roce=1|" +
				"siw0 parent=eth0 netdevs=eth0 port=eth0 uverbs2 mad=0 roce=-1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := preset(t, "vm")
			opts := []hca.Option{hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot), hca.WithReadFile(n.ReadFile)}
			if tt.netlink {
				opts = append(opts, hca.WithNetlink(n.Netlink()))
			}
			inv, err := hca.Discover(opts...)
			if err != nil {
				t.Fatal(err)
			}
			if len(inv.Warnings) > 0 {
				t.Errorf("warnings: %q", inv.Warnings)
			}
			var rows []string
			for _, h := range inv.HCAs {
				if !h.Usable || len(h.Warnings) > 0 {
					t.Errorf("%s: usable %v (%s), warnings %q", h.Name, h.Usable, h.UnusableReason, h.Warnings)
				}
				dash := func(s string) string {
					if s == "" {
						return "-"
					}
					return s
				}
				rows = append(rows, strings.Join([]string{h.Name, "parent=" + dash(h.ParentNetdev),
					"netdevs=" + dash(strings.Join(h.Netdevs, ",")), "port=" + dash(h.Ports[0].Netdev), h.Uverbs.Name,
					"mad=" + strconv.Itoa(len(h.MAD)), "roce=" + strconv.Itoa(h.Ports[0].RoCEv2GIDIndex)}, " "))
			}
			if got := strings.Join(rows, "|"); got != tt.want {
				t.Errorf("got\n%s\nwant\n%s", strings.ReplaceAll(got, "|", "\n"), strings.ReplaceAll(tt.want, "|", "\n"))
			}
			// Without the simulator's read seam its EINVAL files read as empty:
			// discovery must not depend on reading them.
			plain, err := hca.Discover(append(opts[:2:2], opts[3:]...)...)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(inv, plain); diff != "" {
				t.Errorf("without the read seam (-with +without):\n%s", diff)
			}
		})
	}
}
