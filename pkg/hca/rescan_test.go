package hca_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

// The daemon reads sysfs through directory descriptors (openat); tests
// with a WithReadFile hook read every file by path. Both must see the same
// node, attribute by attribute.
func TestDiscoverDirectReadsMatchPathReads(t *testing.T) {
	specs := map[string]hcatest.Spec{"synthetic-8": hcatest.Synthetic(8)}
	for _, name := range hcatest.PresetNames() {
		spec, err := hcatest.Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		specs[name] = spec
	}
	for name, spec := range specs {
		t.Run(name, func(t *testing.T) {
			n := build(t, spec)
			byPath, err := hca.Discover(hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot), hca.WithReadFile(n.ReadFile))
			if err != nil {
				t.Fatal(err)
			}
			direct, err := hca.Discover(hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot))
			if err != nil {
				t.Fatal(err)
			}
			if len(direct.HCAs) != len(spec.HCAs) && !spec.ForeignNetns {
				t.Errorf("%d HCAs, want %d", len(direct.HCAs), len(spec.HCAs))
			}
			if !reflect.DeepEqual(direct, byPath) {
				t.Errorf("direct reads:\n%+v\nreads by path:\n%+v", direct, byPath)
			}
		})
	}
}

// How each change reaches the inventory (see rescan.go).
const (
	// The next rescan re-reads it: it changes without a kernel event.
	byRescan = "rescan"
	// The kernel announces it (uevent, link or address message): the
	// daemon invalidates, and the next discovery is a full pass.
	byEvent = "event"
	// Neither: the full rescan interval is the safety net.
	byFullInterval = "full interval"
)

// Every change is seen: what changes silently by the next rescan, what
// the kernel announces by the discovery after the event, the rest by the
// next full pass.
func TestRescanSeesEveryChange(t *testing.T) {
	for _, tt := range rescanCases() {
		t.Run(tt.name, func(t *testing.T) { checkRescanSees(t, tt) })
	}
}

// rescanCase is a change to a node's sysfs and how the discoverer must see it.
type rescanCase struct {
	name   string
	spec   hcatest.Spec
	seenBy string
	// fullPass: the rescan itself finds the change needs one.
	fullPass bool
	change   func(t *testing.T, n *hcatest.Node)
	check    func(inv hca.Inventory) error
}

func rescanCases() []rescanCase {
	dgx, _ := hcatest.Preset("dgx-h100")
	rxe, _ := hcatest.Preset("rxe")
	return []rescanCase{{
		name: "a port's rate changed", spec: dgx, seenBy: byRescan,
		change: func(t *testing.T, n *hcatest.Node) {
			write(t, filepath.Join(n.IBDevDir("mlx5_1"), "ports", "1", "rate"), "200 Gb/sec (4X HDR)")
		},
		check: func(inv hca.Inventory) error {
			if p := findHCA(inv, "mlx5_1").Ports[0]; p.RateGbps != 200 || p.Speed != "HDR" {
				return fmt.Errorf("mlx5_1 port 1 rate %v %s, want 200 HDR", p.RateGbps, p.Speed)
			}
			return nil
		},
	}, {
		name: "a LID assigned by the subnet manager", spec: dgx, seenBy: byRescan,
		change: func(t *testing.T, n *hcatest.Node) {
			write(t, filepath.Join(n.IBDevDir("mlx5_2"), "ports", "1", "lid"), "0x4242")
		},
		check: func(inv hca.Inventory) error {
			if p := findHCA(inv, "mlx5_2").Ports[0]; p.LID != 0x4242 {
				return fmt.Errorf("mlx5_2 port 1 LID %#x, want 0x4242", p.LID)
			}
			return nil
		},
	}, {
		name: "a subnet prefix changed by the subnet manager", spec: dgx, seenBy: byRescan, fullPass: true,
		change: func(t *testing.T, n *hcatest.Node) {
			write(t, filepath.Join(n.IBDevDir("mlx5_4"), "ports", "1", "gids", "0"), "fec0:0000:0000:0001:a088:c203:0012:3a44")
		},
		check: func(inv hca.Inventory) error {
			if g := findGID(inv, "mlx5_4", 0); g == nil || g.GID != "fec0:0000:0000:0001:a088:c203:0012:3a44" {
				return fmt.Errorf("mlx5_4 GID 0 = %+v, want the new prefix", g)
			}
			return nil
		},
	}, {
		name: "a GID added in an empty slot", spec: rxe, seenBy: byEvent,
		change: func(t *testing.T, n *hcatest.Node) {
			port := filepath.Join(n.IBDevDir("rxe0"), "ports", "1")
			write(t, filepath.Join(port, "gids", "700"), "0000:0000:0000:0000:0000:ffff:0a00:0063")
			write(t, filepath.Join(port, "gid_attrs", "types", "700"), "RoCE v2")
			write(t, filepath.Join(port, "gid_attrs", "ndevs", "700"), "eth0")
		},
		check: func(inv hca.Inventory) error {
			g := findGID(inv, "rxe0", 700)
			if g == nil || g.GID != "0000:0000:0000:0000:0000:ffff:0a00:0063" || g.Type != "RoCE v2" || g.Netdev != "eth0" {
				return fmt.Errorf("GID 700 = %+v, want ::ffff:10.0.0.99, RoCE v2, eth0", g)
			}
			return nil
		},
	}, {
		name: "a GID removed", spec: rxe, seenBy: byEvent,
		change: func(t *testing.T, n *hcatest.Node) {
			write(t, filepath.Join(n.IBDevDir("rxe0"), "ports", "1", "gids", "1"), "0000:0000:0000:0000:0000:0000:0000:0000")
		},
		check: func(inv hca.Inventory) error {
			if g := findGID(inv, "rxe0", 1); g != nil {
				return fmt.Errorf("GID 1 = %+v, want none", g)
			}
			if i := inv.HCAs[0].Ports[0].RoCEv2GIDIndex; i != -1 {
				return fmt.Errorf("RoCE v2 GID index %d, want -1 once the IPv4 GID is gone", i)
			}
			return nil
		},
	}, {
		name: "a netdev renamed", spec: dgx, seenBy: byEvent,
		change: func(t *testing.T, n *hcatest.Node) {
			if err := n.RenameNetdev("ens1f0np0", "rdma0"); err != nil {
				t.Fatal(err)
			}
		},
		check: func(inv hca.Inventory) error {
			h := findHCA(inv, "mlx5_8")
			if h == nil || !slices.Equal(h.Netdevs, []string{"rdma0"}) {
				return fmt.Errorf("mlx5_8 = %+v, want netdevs [rdma0]", h)
			}
			for _, g := range h.Ports[0].GIDs {
				if g.Netdev != "rdma0" {
					return fmt.Errorf("mlx5_8 GID %d netdev %q, want rdma0", g.Index, g.Netdev)
				}
			}
			return nil
		},
	}, {
		name: "a port going down", spec: dgx, seenBy: byRescan,
		change: func(t *testing.T, n *hcatest.Node) {
			if err := n.SetPortState("mlx5_3", 1, "1: DOWN", "3: Disabled"); err != nil {
				t.Fatal(err)
			}
		},
		check: func(inv hca.Inventory) error {
			if p := findHCA(inv, "mlx5_3").Ports[0]; p.State != "DOWN" || p.PhysState != "Disabled" {
				return fmt.Errorf("mlx5_3 port 1 is %s/%s, want DOWN/Disabled", p.State, p.PhysState)
			}
			return nil
		},
	}, {
		name: "a node description set by rdma-ndd", spec: dgx, seenBy: byFullInterval,
		change: func(t *testing.T, n *hcatest.Node) {
			write(t, filepath.Join(n.IBDevDir("mlx5_0"), "node_desc"), "dgx01 HCA-1")
		},
		check: func(inv hca.Inventory) error {
			if d := findHCA(inv, "mlx5_0").NodeDesc; d != "dgx01 HCA-1" {
				return fmt.Errorf("mlx5_0 node_desc %q", d)
			}
			return nil
		},
	}, {
		name: "an HCA removed", spec: dgx, seenBy: byRescan, fullPass: true,
		change: func(t *testing.T, n *hcatest.Node) {
			if err := n.RemoveHCA("mlx5_5"); err != nil {
				t.Fatal(err)
			}
		},
		check: func(inv hca.Inventory) error {
			if h := findHCA(inv, "mlx5_5"); h != nil || len(inv.HCAs) != 9 {
				return fmt.Errorf("%d HCAs, mlx5_5 = %v; want 9 without it", len(inv.HCAs), h)
			}
			return nil
		},
	}}
}

// checkRescanSees makes tt's change between two discoveries and checks the
// second sees it, by the way tt says.
func checkRescanSees(t *testing.T, tt rescanCase) {
	n := build(t, tt.spec)
	opts := []hca.Option{hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot)}
	if tt.seenBy == byFullInterval {
		// Every pass is the full one an interval makes.
		opts = append(opts, hca.WithFullRescanInterval(0))
	}
	d := hca.NewDiscoverer(opts...)
	before, err := d.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if tt.check(before) == nil {
		t.Fatal("the check passes before the change: it proves nothing")
	}
	if _, err := d.PortStates(); err != nil {
		t.Fatal(err)
	}
	tt.change(t, n)
	if tt.seenBy == byEvent {
		d.Invalidate()
	}
	full := d.FullPasses()
	after, err := d.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if err := tt.check(after); err != nil {
		t.Error(err)
	}
	if tt.seenBy == byRescan && (d.FullPasses() > full) != tt.fullPass {
		t.Errorf("full passes %d -> %d; want a full pass: %v", full, d.FullPasses(), tt.fullPass)
	}
}

// PortStates keeps the state files open; a rewritten file, a removed
// ibdev and an ibdev replaced under the same name are all seen.
func TestPortStatesHeldFiles(t *testing.T) {
	spec, _ := hcatest.Preset("dgx-h100")
	n := build(t, spec)
	d := hca.NewDiscoverer(hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot))
	states := func() map[string]string {
		t.Helper()
		m, err := d.PortStates()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	want := "4: ACTIVE\n5: LinkUp\n"
	if got := states()["mlx5_1/1"]; got != want {
		t.Fatalf("mlx5_1/1 = %q, want %q", got, want)
	}
	for _, s := range [][2]string{{"1: DOWN", "3: Disabled"}, {"2: INIT", "5: LinkUp"}, {"4: ACTIVE", "5: LinkUp"}} {
		if err := n.SetPortState("mlx5_1", 1, s[0], s[1]); err != nil {
			t.Fatal(err)
		}
		if got, want := states()["mlx5_1/1"], s[0]+"\n"+s[1]+"\n"; got != want {
			t.Errorf("after setting %v: mlx5_1/1 = %q, want %q", s, got, want)
		}
	}

	// A driver reload: a new ibdev directory under the same name, while
	// the old one's files still exist (a tmpfs keeps them for the held
	// descriptors; the kernel would answer ENODEV).
	ibdir := n.IBDevDir("mlx5_2")
	copyTree(t, ibdir, ibdir+".new")
	write(t, filepath.Join(ibdir+".new", "ports", "1", "state"), "1: DOWN")
	if err := os.Rename(ibdir, ibdir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(ibdir+".new", ibdir); err != nil {
		t.Fatal(err)
	}
	if got := states()["mlx5_2/1"]; got != "1: DOWN\n5: LinkUp\n" {
		t.Errorf("replaced mlx5_2/1 = %q, want the new directory's DOWN", got)
	}

	if err := n.RemoveHCA("mlx5_4"); err != nil {
		t.Fatal(err)
	}
	m := states()
	if _, ok := m["mlx5_4/1"]; ok || len(m) != 9 {
		t.Errorf("after removing mlx5_4: %d ports, mlx5_4/1 listed %v; want 9 without it", len(m), ok)
	}
}

func findHCA(inv hca.Inventory, name string) *hca.HCA {
	for i := range inv.HCAs {
		if inv.HCAs[i].Name == name {
			return &inv.HCAs[i]
		}
	}
	return nil
}

func findGID(inv hca.Inventory, ibdev string, index int) *hca.GID {
	h := findHCA(inv, ibdev)
	if h == nil {
		return nil
	}
	for i := range h.Ports[0].GIDs {
		if h.Ports[0].GIDs[i].Index == index {
			return &h.Ports[0].GIDs[i]
		}
	}
	return nil
}

// write rewrites a file in place, as the kernel changes an attribute.
func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// copyTree copies a directory of files, directories and symlinks.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		switch {
		case e.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case e.IsDir():
			return os.Mkdir(to, 0o755)
		default:
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, 0o644)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}
