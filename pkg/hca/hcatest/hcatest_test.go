package hcatest

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

func buildPreset(t testing.TB, name string) *Node {
	t.Helper()
	s, err := Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	n, err := Build(t.TempDir(), s)
	if err != nil {
		t.Fatalf("Build(%s): %v", name, err)
	}
	return n
}

// content reads a sysfs file and checks it ends with "\n", as sysfs does.
func content(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := strings.CutSuffix(string(b), "\n")
	if !ok {
		t.Errorf("%s: %q does not end with a newline", path, b)
	}
	return s
}

func wantContent(t *testing.T, path, want string) {
	t.Helper()
	if got := content(t, path); got != want {
		t.Errorf("%s = %q, want %q", path, got, want)
	}
}

// sameFile checks that link resolves to dir.
func sameFile(t *testing.T, link, dir string) {
	t.Helper()
	got, err := filepath.EvalSymlinks(link)
	if err != nil {
		t.Errorf("resolving %s: %v", link, err)
		return
	}
	want, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Errorf("resolving %s: %v", dir, err)
		return
	}
	if got != want {
		t.Errorf("%s resolves to %s, want %s", link, got, want)
	}
}

func TestPresets(t *testing.T) {
	t.Parallel()
	tests := []struct {
		preset  string
		hcas    []string
		netns   string
		rdmaCM  string // "" => absent
		extraFn func(t *testing.T, n *Node)
	}{
		{"dgx-h100", []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"}, "Y", "10:58", checkDGX},
		{"roce-sriov", []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5"}, "N", "10:59", checkSRIOV},
		{"softroce", []string{"rxe0"}, "Y", "10:122", checkSoftRoCE},
		{"rxe", []string{"rxe0"}, "Y", "10:124", checkRXE},
		{"siw", []string{"siw0"}, "Y", "10:124", checkSIW},
		{"vm", []string{"rxe0", "rxe1", "siw0"}, "Y", "10:124", checkVM},
		{"empty", nil, "Y", "", checkEmpty},
		{"broken", []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5"}, "Y", "10:58", checkBroken},
		{"gb200", []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}, "Y", "10:58", checkGB200},
		{"gb300", []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}, "Y", "10:58", checkGB300(true)},
		{"gb300-acs-bad", []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}, "Y", "10:58", checkGB300(false)},
	}
	if got, want := len(tests), len(PresetNames()); got != want {
		t.Errorf("testing %d presets, there are %d", got, want)
	}
	for _, tt := range tests {
		t.Run(tt.preset, func(t *testing.T) {
			t.Parallel()
			n := buildPreset(t, tt.preset)
			sys := n.SysfsRoot

			var names []string
			for _, h := range n.Spec.HCAs {
				names = append(names, h.Name)
			}
			if !slices.Equal(names, tt.hcas) {
				t.Errorf("HCAs %v, want %v", names, tt.hcas)
			}
			entries, err := os.ReadDir(filepath.Join(sys, "class", "infiniband"))
			if err != nil || len(entries) != len(tt.hcas) {
				t.Errorf("class/infiniband has %d entries (%v), want %d", len(entries), err, len(tt.hcas))
			}
			wantContent(t, filepath.Join(sys, "module/ib_core/parameters/netns_mode"), tt.netns)
			wantContent(t, filepath.Join(sys, "class/infiniband_verbs/abi_version"), "6")
			wantContent(t, filepath.Join(sys, "class/infiniband_mad/abi_version"), "5")
			cm := filepath.Join(sys, "class/misc/rdma_cm/dev")
			if tt.rdmaCM == "" {
				if _, err := os.Stat(cm); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s: %v, want no rdma_cm", cm, err)
				}
				if _, err := os.Lstat(filepath.Join(n.DevRoot, "infiniband", "rdma_cm")); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("dev rdma_cm exists without the module")
				}
			} else {
				wantContent(t, cm, tt.rdmaCM)
				sameFile(t, filepath.Join(sys, "class/misc/rdma_cm"), filepath.Join(sys, "devices/virtual/misc/rdma_cm"))
			}
			for i := range n.Spec.HCAs {
				checkHCA(t, n, &n.Spec.HCAs[i])
			}
			checkTree(t, n)
			tt.extraFn(t, n)
		})
	}
}

// checkHCA asserts the layout contract for one HCA from its spec.
func checkHCA(t *testing.T, n *Node, h *HCASpec) {
	t.Helper()
	sys := n.SysfsRoot
	class := filepath.Join(sys, "class", "infiniband", h.Name)
	ibdir := n.IBDevDir(h.Name)
	if fi, err := os.Stat(class); err != nil || !fi.IsDir() {
		t.Errorf("%s: %v, want a link to a dir", class, err)
	}
	sameFile(t, class, ibdir)
	wantContent(t, filepath.Join(class, "node_type"), h.NodeType)
	wantContent(t, filepath.Join(class, "node_guid"), h.NodeGUID)
	wantContent(t, filepath.Join(class, "sys_image_guid"), h.SysImageGUID)
	if h.NodeDesc != "" {
		wantContent(t, filepath.Join(class, "node_desc"), h.NodeDesc)
	} else {
		wantContent(t, filepath.Join(class, "node_desc"), n.Spec.Hostname+" "+h.Name)
	}

	pciDir := n.PCIDir(h.Name)
	if h.PCI == nil {
		if pciDir != "" {
			t.Errorf("software %s has PCI dir %s", h.Name, pciDir)
		}
		if !strings.HasPrefix(ibdir, filepath.Join(sys, "devices", "virtual", "infiniband")+"/") {
			t.Errorf("software %s at %s, want under devices/virtual/infiniband", h.Name, ibdir)
		}
		if _, err := os.Lstat(filepath.Join(ibdir, "device")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("software %s has a device link", h.Name)
		}
	} else {
		p := h.PCI
		if want := filepath.Join(append([]string{sys, "devices"}, p.Path...)...); pciDir != want {
			t.Errorf("PCIDir(%s) = %s, want %s", h.Name, pciDir, want)
		}
		if l, _ := os.Readlink(filepath.Join(ibdir, "device")); l != "../../../"+p.BusID {
			t.Errorf("%s/device -> %q, want ../../../%s", h.Name, l, p.BusID)
		}
		sameFile(t, filepath.Join(class, "device"), pciDir)
		sameFile(t, filepath.Join(sys, "bus/pci/devices", p.BusID), pciDir)
		sameFile(t, filepath.Join(pciDir, "driver"), filepath.Join(sys, "bus/pci/drivers", p.Driver))
		if l, _ := os.Readlink(filepath.Join(pciDir, "driver")); l != strings.Repeat("../", len(p.Path)+1)+"bus/pci/drivers/"+p.Driver {
			t.Errorf("%s driver -> %q: depth does not follow the path", p.BusID, l)
		}
		wantContent(t, filepath.Join(pciDir, "vendor"), "0x"+p.Vendor)
		wantContent(t, filepath.Join(pciDir, "device"), "0x"+p.Device)
		wantContent(t, filepath.Join(pciDir, "subsystem_vendor"), "0x"+p.SubsystemVendor)
		wantContent(t, filepath.Join(pciDir, "subsystem_device"), "0x"+p.SubsystemDevice)
		if _, ok := h.Corrupt["pci:numa_node"]; !ok {
			wantContent(t, filepath.Join(pciDir, "numa_node"), fmt.Sprint(p.NUMANode))
		}
		for _, br := range p.Path[1 : len(p.Path)-1] {
			if !slices.ContainsFunc(n.Spec.Devices, func(d PCIDevSpec) bool { return d.BusID() == br }) {
				// A bridge the spec does not declare: an Intel root port.
				wantContent(t, filepath.Join(sys, "bus/pci/devices", br, "vendor"), "0x8086")
			}
		}
	}

	for i, port := range h.Ports {
		dir := filepath.Join(class, "ports", fmt.Sprint(i+1))
		for file, want := range map[string]string{
			"state": port.State, "phys_state": port.PhysState, "link_layer": port.LinkLayer,
			"rate": port.Rate, "lid": fmt.Sprintf("0x%x", port.LID), "sm_lid": fmt.Sprintf("0x%x", port.SMLID),
		} {
			if _, corrupt := h.Corrupt[fmt.Sprintf("ports/%d/%s", i+1, file)]; !corrupt {
				wantContent(t, filepath.Join(dir, file), want)
			}
		}
		gids := map[int]GIDSpec{}
		for _, g := range port.GIDs {
			gids[g.Index] = g
		}
		for k := 0; k < port.GIDTableLen; k++ {
			gidPath := filepath.Join(dir, "gids", fmt.Sprint(k))
			types := filepath.Join(ibdir, "ports", fmt.Sprint(i+1), "gid_attrs", "types", fmt.Sprint(k))
			ndevs := filepath.Join(ibdir, "ports", fmt.Sprint(i+1), "gid_attrs", "ndevs", fmt.Sprint(k))
			g, ok := gids[k]
			if !ok {
				wantContent(t, gidPath, "0000:0000:0000:0000:0000:0000:0000:0000")
				wantFault(t, n, types)
				wantFault(t, n, ndevs)
				continue
			}
			wantContent(t, gidPath, g.GID)
			wantContent(t, types, g.Type)
			if port.LinkLayer == "InfiniBand" || g.Netdev == "" {
				wantFault(t, n, ndevs)
			} else {
				wantContent(t, ndevs, g.Netdev)
			}
		}
		if port.UMAD >= 0 {
			for _, m := range []struct {
				name string
				dev  string
			}{
				{fmt.Sprintf("umad%d", port.UMAD), fmt.Sprintf("231:%d", port.UMAD)},
				{fmt.Sprintf("issm%d", port.UMAD), fmt.Sprintf("231:%d", 64+port.UMAD)},
			} {
				l := filepath.Join(sys, "class", "infiniband_mad", m.name)
				sameFile(t, l, filepath.Join(filepath.Dir(ibdir), "..", "infiniband_mad", m.name))
				wantContent(t, filepath.Join(l, "ibdev"), h.Name)
				wantContent(t, filepath.Join(l, "port"), fmt.Sprint(i+1))
				wantContent(t, filepath.Join(l, "dev"), m.dev)
			}
		}
	}

	if h.Uverbs >= 0 {
		name := fmt.Sprintf("uverbs%d", h.Uverbs)
		l := filepath.Join(sys, "class", "infiniband_verbs", name)
		sameFile(t, l, filepath.Join(filepath.Dir(ibdir), "..", "infiniband_verbs", name))
		wantContent(t, filepath.Join(l, "ibdev"), h.Name)
		wantContent(t, filepath.Join(l, "dev"), fmt.Sprintf("231:%d", 192+h.Uverbs))
		wantContent(t, filepath.Join(l, "abi_version"), uverbsABI(h))
		if h.PCI != nil {
			sameFile(t, filepath.Join(l, "device"), pciDir)
		}
	}

	for _, nd := range h.Netdevs {
		l := filepath.Join(sys, "class", "net", nd)
		want := filepath.Join(sys, "devices", "virtual", "net", nd)
		if h.PCI != nil {
			want = filepath.Join(pciDir, "net", nd)
		}
		sameFile(t, l, want)
		content(t, filepath.Join(l, "ifindex"))
	}
}

func wantFault(t *testing.T, n *Node, path string) {
	t.Helper()
	if n.Faults[path] != syscall.EINVAL {
		t.Errorf("Faults[%s] = %v, want EINVAL", path, n.Faults[path])
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != 0 {
		t.Errorf("fault file %s: %v, want an existing empty file", path, err)
	}
}

// checkTree walks the whole tree: every link is relative and resolves,
// every file but a fault or a binary attribute (config, vpd) ends with a
// newline.
func checkTree(t *testing.T, n *Node) {
	t.Helper()
	err := filepath.WalkDir(n.SysfsRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if filepath.IsAbs(target) {
				t.Errorf("%s -> %s is absolute", path, target)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s -> %s dangles: %v", path, target, err)
			}
		case d.Type().IsRegular():
			if _, fault := n.Faults[path]; !fault && d.Name() != "config" && d.Name() != "vpd" {
				content(t, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func checkDGX(t *testing.T, n *Node) {
	guids := map[string]bool{}
	lids := map[uint16]bool{}
	for _, h := range n.Spec.HCAs {
		if guids[h.NodeGUID] {
			t.Errorf("duplicate GUID %s", h.NodeGUID)
		}
		guids[h.NodeGUID] = true
		if p := h.Ports[0]; p.LinkLayer == "InfiniBand" {
			if lids[p.LID] {
				t.Errorf("duplicate LID %#x", p.LID)
			}
			lids[p.LID] = true
		}
	}
	mlx0 := n.IBDevDir("mlx5_0")
	wantContent(t, filepath.Join(mlx0, "hca_type"), "MT4129")
	wantContent(t, filepath.Join(mlx0, "fw_ver"), "28.39.2048")
	wantContent(t, filepath.Join(mlx0, "board_id"), "MT_0000000838")
	wantContent(t, filepath.Join(mlx0, "ports/1/gids/0"), "fe80:0000:0000:0000:a088:c203:0012:3a40")
	wantContent(t, filepath.Join(mlx0, "ports/1/rate"), "400 Gb/sec (4X NDR)")
	for ib, want := range map[string]struct{ root, bus, netdev, numa string }{
		"mlx5_0": {"pci0000:15", "0000:16:00.0", "ibp22s0", "0"},
		"mlx5_3": {"pci0000:3e", "0000:40:00.0", "ibp64s0", "0"},
		"mlx5_4": {"pci0000:9a", "0000:9b:00.0", "ibp155s0", "1"},
		"mlx5_7": {"pci0000:c0", "0000:c2:00.0", "ibp194s0", "1"},
		"mlx5_8": {"pci0000:d0", "0000:d1:00.0", "ens1f0np0", "1"},
		"mlx5_9": {"pci0000:d0", "0000:d1:00.1", "ens1f1np1", "1"},
	} {
		dir := n.PCIDir(ib)
		rel, _ := filepath.Rel(n.SysfsRoot, dir)
		if parts := strings.Split(rel, "/"); parts[1] != want.root || filepath.Base(dir) != want.bus {
			t.Errorf("%s at %s, want root %s bus %s", ib, rel, want.root, want.bus)
		}
		wantContent(t, filepath.Join(dir, "numa_node"), want.numa)
		sameFile(t, filepath.Join(n.SysfsRoot, "class/net", want.netdev), filepath.Join(dir, "net", want.netdev))
	}
	bf := n.IBDevDir("mlx5_8")
	wantContent(t, filepath.Join(bf, "hca_type"), "MT41692")
	wantContent(t, filepath.Join(bf, "ports/1/link_layer"), "Ethernet")
	wantContent(t, filepath.Join(bf, "ports/1/gids/2"), "0000:0000:0000:0000:0000:ffff:0a00:0001")
	wantContent(t, filepath.Join(bf, "ports/1/gid_attrs/types/3"), "RoCE v2")
	wantContent(t, filepath.Join(bf, "ports/1/gid_attrs/ndevs/3"), "ens1f0np0")
	wantContent(t, filepath.Join(n.IBDevDir("mlx5_9"), "sys_image_guid"), content(t, filepath.Join(bf, "sys_image_guid")))
}

func checkSRIOV(t *testing.T, n *Node) {
	pf := n.PCIDir("mlx5_0")
	wantContent(t, filepath.Join(pf, "sriov_totalvfs"), "8")
	wantContent(t, filepath.Join(pf, "sriov_numvfs"), "4")
	wantContent(t, filepath.Join(n.PCIDir("mlx5_1"), "sriov_numvfs"), "0")
	wantContent(t, filepath.Join(n.IBDevDir("mlx5_1"), "ports/1/state"), "1: DOWN")
	for v := 0; v < 4; v++ {
		ib := fmt.Sprintf("mlx5_%d", 2+v)
		vf := n.PCIDir(ib)
		if filepath.Dir(vf) != filepath.Dir(pf) {
			t.Errorf("VF %s is not a sibling of its PF", vf)
		}
		if l, _ := os.Readlink(filepath.Join(pf, fmt.Sprintf("virtfn%d", v))); l != "../"+filepath.Base(vf) {
			t.Errorf("virtfn%d -> %q", v, l)
		}
		sameFile(t, filepath.Join(pf, fmt.Sprintf("virtfn%d", v)), vf)
		sameFile(t, filepath.Join(vf, "physfn"), pf)
		wantContent(t, filepath.Join(vf, "device"), "0x101e")
		wantContent(t, filepath.Join(n.IBDevDir(ib), "hca_type"), "MT4126")
		if _, err := os.Stat(filepath.Join(vf, "sriov_totalvfs")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("VF %s has sriov_totalvfs", ib)
		}
		nd := fmt.Sprintf("enp59s0f0v%d", v)
		sameFile(t, filepath.Join(n.SysfsRoot, "class/net", nd), filepath.Join(vf, "net", nd))
		wantContent(t, filepath.Join(n.IBDevDir(ib), "ports/1/gids/2"), fmt.Sprintf("0000:0000:0000:0000:0000:ffff:c0a8:64%02x", 20+v))
	}
}

func checkSoftRoCE(t *testing.T, n *Node) {
	checkRXELayout(t, n, "192.168.122.10")
	wantContent(t, filepath.Join(n.IBDevDir("rxe0"), "node_desc"), "vm01 rxe0")
	sameFile(t, filepath.Join(n.SysfsRoot, "class/infiniband_mad/umad0"), filepath.Join(n.SysfsRoot, "devices/virtual/infiniband_mad/umad0"))
}

func checkRXE(t *testing.T, n *Node) {
	checkRXELayout(t, n, "10.0.2.15")
	wantContent(t, filepath.Join(n.IBDevDir("rxe0"), "node_desc"), "rxe")
	sameFile(t, filepath.Join(n.SysfsRoot, "class/infiniband_mad/umad0"), filepath.Join(n.SysfsRoot, "devices/virtual/infiniband_mad/umad0"))
}

// checkVM holds what the test/vm guest's sysfs showed for all three devices.
func checkVM(t *testing.T, n *Node) {
	checkRXELayout(t, n, "10.0.2.15")
	checkSIW(t, n)
	wantContent(t, filepath.Join(n.IBDevDir("rxe1"), "parent"), "eth1")
	wantContent(t, filepath.Join(n.IBDevDir("rxe1"), "node_guid"), "5054:00ff:fe12:3457")
	wantContent(t, filepath.Join(n.IBDevDir("rxe1"), "ports/1/gids/1"), "0000:0000:0000:0000:0000:ffff:0a00:030f")
	wantContent(t, filepath.Join(n.IBDevDir("siw0"), "node_guid"), "5054:00ff:fe12:3456")
	for uverbs, ib := range map[string]string{"uverbs0": "rxe0", "uverbs1": "rxe1", "uverbs2": "siw0"} {
		wantContent(t, filepath.Join(n.SysfsRoot, "class/infiniband_verbs", uverbs, "ibdev"), ib)
	}
	mads, _ := os.ReadDir(filepath.Join(n.SysfsRoot, "class/infiniband_mad"))
	var names []string
	for _, m := range mads {
		names = append(names, m.Name())
	}
	if want := []string{"abi_version", "issm0", "issm1", "umad0", "umad1"}; !slices.Equal(names, want) {
		t.Errorf("class/infiniband_mad: %v, want %v", names, want)
	}
	wantContent(t, filepath.Join(n.SysfsRoot, "class/net/eth0/ifindex"), "2")
	wantContent(t, filepath.Join(n.SysfsRoot, "class/net/eth1/ifindex"), "3")
}

// checkRXELayout holds what Linux 6.1 showed for rxe0 on virtio-net.
func checkRXELayout(t *testing.T, n *Node, ip string) {
	rxe := n.IBDevDir("rxe0")
	for _, f := range []string{"hca_type", "board_id", "hw_rev", "device"} {
		if _, err := os.Lstat(filepath.Join(rxe, f)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("rxe0 has %s", f)
		}
	}
	wantContent(t, filepath.Join(rxe, "fw_ver"), "")
	wantContent(t, filepath.Join(rxe, "parent"), "eth0")
	wantContent(t, filepath.Join(rxe, "node_guid"), "5054:00ff:fe12:3456")
	wantContent(t, filepath.Join(rxe, "ports/1/rate"), "2.5 Gb/sec (1X SDR)")
	wantContent(t, filepath.Join(rxe, "ports/1/cap_mask"), "0x00010000")
	wantContent(t, filepath.Join(rxe, "ports/1/pkeys/0"), "0xffff")
	if gids, _ := os.ReadDir(filepath.Join(rxe, "ports/1/gids")); len(gids) != 1024 {
		t.Errorf("%d GID slots, want 1024", len(gids))
	}
	wantContent(t, filepath.Join(rxe, "ports/1/gids/0"), "fe80:0000:0000:0000:5054:00ff:fe12:3456")
	a := strings.Split(ip, ".")
	var b [4]int
	for i := range a {
		fmt.Sscan(a[i], &b[i])
	}
	wantContent(t, filepath.Join(rxe, "ports/1/gids/1"), fmt.Sprintf("0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", b[0], b[1], b[2], b[3]))
	for _, k := range []string{"0", "1"} {
		wantContent(t, filepath.Join(rxe, "ports/1/gid_attrs/types", k), "RoCE v2")
		wantContent(t, filepath.Join(rxe, "ports/1/gid_attrs/ndevs", k), "eth0")
	}
	for _, k := range []string{"2", "1023"} {
		wantFault(t, n, filepath.Join(rxe, "ports/1/gid_attrs/types", k))
		wantFault(t, n, filepath.Join(rxe, "ports/1/gid_attrs/ndevs", k))
	}
	wantContent(t, filepath.Join(n.SysfsRoot, "class/net/eth0/address"), "52:54:00:12:34:56")
	sameFile(t, filepath.Join(n.SysfsRoot, "class/infiniband/rxe0"), filepath.Join(n.SysfsRoot, "devices/virtual/infiniband/rxe0"))
	sameFile(t, filepath.Join(n.SysfsRoot, "class/infiniband_verbs/uverbs0"), filepath.Join(n.SysfsRoot, "devices/virtual/infiniband_verbs/uverbs0"))
}

func checkSIW(t *testing.T, n *Node) {
	siw := n.IBDevDir("siw0")
	for _, f := range []string{"hca_type", "board_id", "hw_rev", "device", "parent"} {
		if _, err := os.Lstat(filepath.Join(siw, f)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("siw0 has %s", f)
		}
	}
	wantContent(t, filepath.Join(siw, "node_type"), "4: RNIC")
	wantContent(t, filepath.Join(siw, "ports/1/cap_mask"), "0x00090000")
	if _, err := os.Stat(filepath.Join(siw, "ports/1/pkeys")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("siw0 has a P_Key table")
	}
	wantContent(t, filepath.Join(siw, "fw_ver"), "")
	wantContent(t, filepath.Join(siw, "ports/1/gids/0"), "5254:0012:3456:0000:0000:0000:0000:0000")
	wantContent(t, filepath.Join(siw, "ports/1/gid_attrs/types/0"), "IB/RoCE v1")
	wantFault(t, n, filepath.Join(siw, "ports/1/gid_attrs/ndevs/0"))
	if gids, _ := os.ReadDir(filepath.Join(siw, "ports/1/gids")); len(gids) != 1 {
		t.Errorf("%d GID slots, want 1", len(gids))
	}
	wantContent(t, filepath.Join(n.SysfsRoot, "class/net/eth0/address"), "52:54:00:12:34:56")
}

func checkEmpty(t *testing.T, n *Node) {
	for _, class := range []string{"infiniband", "infiniband_verbs", "infiniband_mad"} {
		entries, err := os.ReadDir(filepath.Join(n.SysfsRoot, "class", class))
		if err != nil {
			t.Errorf("class/%s: %v", class, err)
		}
		for _, e := range entries {
			if e.Name() != "abi_version" {
				t.Errorf("class/%s has %s", class, e.Name())
			}
		}
	}
	entries, _ := os.ReadDir(filepath.Join(n.DevRoot, "infiniband"))
	if len(entries) != 0 {
		t.Errorf("dev/infiniband has %d entries", len(entries))
	}
}

func checkBroken(t *testing.T, n *Node) {
	wantContent(t, filepath.Join(n.IBDevDir("mlx5_1"), "ports/1/rate"), "fast")
	wantContent(t, filepath.Join(n.IBDevDir("mlx5_2"), "ports/1/state"), "banana")
	if _, err := os.Stat(filepath.Join(n.IBDevDir("mlx5_3"), "fw_ver")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("mlx5_3 fw_ver: %v, want missing", err)
	}
	wantContent(t, filepath.Join(n.IBDevDir("mlx5_0"), "fw_ver"), "28.39.2048")
	wantContent(t, filepath.Join(n.PCIDir("mlx5_5"), "numa_node"), "x")
	wantContent(t, filepath.Join(n.SysfsRoot, "class/infiniband_verbs/uverbs4/ibdev"), "mlx5_5")
	verbs, _ := filepath.Glob(filepath.Join(n.SysfsRoot, "class/infiniband_verbs/uverbs*"))
	if len(verbs) != 5 {
		t.Errorf("%d uverbs devices, want 5 (mlx5_4 has none)", len(verbs))
	}
}

// rdev splits a stat's device number as Linux's MAJOR()/MINOR() for
// userspace do.
func rdev(t *testing.T, path string) (major, minor uint64, char bool) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatalf("%s: no Stat_t", path)
	}
	d := uint64(st.Rdev)
	major = (d>>8)&0xfff | (d>>32)&^0xfff
	minor = d&0xff | (d>>12)&^0xff
	return major, minor, fi.Mode()&fs.ModeCharDevice != 0
}

// wantMode checks that the node has the mode udev gives it: 0666 for
// uverbs and rdma_cm, 0600 for umad and issm.
func wantMode(t *testing.T, path, name string) {
	t.Helper()
	want := fs.FileMode(0o666)
	if strings.HasPrefix(name, "umad") || strings.HasPrefix(name, "issm") {
		want = 0o600
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s: mode %v, want %v (as udev makes it)", name, got, want)
	}
}

func TestDevNodes(t *testing.T) {
	t.Parallel()
	spec, _ := Preset("dgx-h100")
	want := map[string][2]uint64{"rdma_cm": {10, 58}}
	for i := 0; i < 10; i++ {
		want[fmt.Sprintf("uverbs%d", i)] = [2]uint64{231, uint64(192 + i)}
		want[fmt.Sprintf("umad%d", i)] = [2]uint64{231, uint64(i)}
		want[fmt.Sprintf("issm%d", i)] = [2]uint64{231, uint64(64 + i)}
	}
	// sysfs dev files agree with the nodes.
	sysDev := func(n *Node, name string) string {
		switch {
		case name == "rdma_cm":
			return filepath.Join(n.SysfsRoot, "class/misc/rdma_cm/dev")
		case strings.HasPrefix(name, "uverbs"):
			return filepath.Join(n.SysfsRoot, "class/infiniband_verbs", name, "dev")
		}
		return filepath.Join(n.SysfsRoot, "class/infiniband_mad", name, "dev")
	}

	t.Run("char devices", func(t *testing.T) {
		t.Parallel()
		n, err := Build(t.TempDir(), spec)
		if err != nil {
			t.Fatal(err)
		}
		if !n.CharDevices {
			t.Skip("not root: /dev nodes are plain files")
		}
		for name, mm := range want {
			path := filepath.Join(n.DevRoot, "infiniband", name)
			major, minor, char := rdev(t, path)
			if !char || major != mm[0] || minor != mm[1] {
				t.Errorf("%s: char=%v %d:%d, want a char device %d:%d", name, char, major, minor, mm[0], mm[1])
			}
			wantMode(t, path, name)
			wantContent(t, sysDev(n, name), fmt.Sprintf("%d:%d", mm[0], mm[1]))
		}
	})
	t.Run("plain files", func(t *testing.T) {
		t.Parallel()
		n, err := build(t.TempDir(), spec, false)
		if err != nil {
			t.Fatal(err)
		}
		for name, mm := range want {
			fi, err := os.Lstat(filepath.Join(n.DevRoot, "infiniband", name))
			if err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
				t.Errorf("%s: %v, want an empty regular file", name, err)
			}
			wantContent(t, sysDev(n, name), fmt.Sprintf("%d:%d", mm[0], mm[1]))
		}
	})
}

func TestDevNumbersPastFixedRanges(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		got  devNum
		want string
	}{
		{uverbsDev(31), "231:223"}, {uverbsDev(32), "243:0"},
		{umadDev(63), "231:63"}, {issmDev(63), "231:127"},
		{umadDev(64), "244:0"}, {issmDev(64), "244:960"},
	} {
		if tt.got.String() != tt.want {
			t.Errorf("got %s, want %s", tt.got, tt.want)
		}
	}
	if d := (devNum{231, 192}).mkdev(); d != 231<<8|192 {
		t.Errorf("mkdev(231:192) = %#x", d)
	}
	if d := (devNum{244, 960}).mkdev(); d != 244<<8|(960&0xff)|(960&^0xff)<<12 {
		t.Errorf("mkdev(244:960) = %#x", d)
	}
}

func TestReadFileFaults(t *testing.T) {
	t.Parallel()
	n := buildPreset(t, "dgx-h100")
	ibNdev := filepath.Join(n.IBDevDir("mlx5_0"), "ports/1/gid_attrs/ndevs/0")
	viaClass := filepath.Join(n.SysfsRoot, "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0")
	emptyType := filepath.Join(n.IBDevDir("mlx5_8"), "ports/1/gid_attrs/types/7")
	for _, path := range []string{ibNdev, viaClass, emptyType} {
		_, err := n.ReadFile(path)
		var pe *fs.PathError
		if !errors.Is(err, syscall.EINVAL) || !errors.As(err, &pe) || pe.Op != "read" || pe.Path != path {
			t.Errorf("ReadFile(%s) = %v, want a read PathError with EINVAL", path, err)
		}
		if b, err := os.ReadFile(path); err != nil || len(b) != 0 {
			t.Errorf("os.ReadFile(%s) = %q, %v: want the empty file listed by the kernel", path, b, err)
		}
	}
	b, err := n.ReadFile(filepath.Join(n.SysfsRoot, "class/infiniband/mlx5_8/ports/1/gid_attrs/ndevs/0"))
	if err != nil || string(b) != "ens1f0np0\n" {
		t.Errorf("RoCE ndevs/0 = %q, %v", b, err)
	}
	if _, err := n.ReadFile(filepath.Join(n.SysfsRoot, "nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}

	// Tests may inject their own faults.
	fw := filepath.Join(n.IBDevDir("mlx5_1"), "fw_ver")
	n.Faults[fw] = syscall.EIO
	if _, err := n.ReadFile(filepath.Join(n.SysfsRoot, "class/infiniband/mlx5_1/fw_ver")); !errors.Is(err, syscall.EIO) {
		t.Errorf("injected fault: %v", err)
	}
}

func TestSetPortState(t *testing.T) {
	t.Parallel()
	n := buildPreset(t, "dgx-h100")
	if err := n.SetPortState("mlx5_3", 1, "1: DOWN", "3: Disabled"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(n.SysfsRoot, "class/infiniband/mlx5_3/ports/1")
	wantContent(t, filepath.Join(dir, "state"), "1: DOWN")
	wantContent(t, filepath.Join(dir, "phys_state"), "3: Disabled")
	if p := n.Spec.HCAs[3].Ports[0]; p.State != "1: DOWN" || p.PhysState != "3: Disabled" {
		t.Errorf("Spec not updated: %+v", p)
	}
	wantContent(t, filepath.Join(n.SysfsRoot, "class/infiniband/mlx5_2/ports/1/state"), "4: ACTIVE")
	for _, tt := range []struct {
		ib   string
		port int
	}{{"mlx5_3", 2}, {"mlx5_3", 0}, {"nope", 1}} {
		if err := n.SetPortState(tt.ib, tt.port, "1: DOWN", "3: Disabled"); err == nil {
			t.Errorf("SetPortState(%s, %d) succeeded", tt.ib, tt.port)
		}
	}
}

func TestRemoveHCA(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		preset, ib string
		uverbs     string
		mad        []string
	}{
		{"dgx-h100", "mlx5_2", "uverbs2", []string{"umad2", "issm2"}},
		{"softroce", "rxe0", "uverbs0", []string{"umad0", "issm0"}},
	} {
		t.Run(tt.ib, func(t *testing.T) {
			t.Parallel()
			n := buildPreset(t, tt.preset)
			ibdir, pci := n.IBDevDir(tt.ib), n.PCIDir(tt.ib)
			before := len(n.Spec.HCAs)
			if err := n.RemoveHCA(tt.ib); err != nil {
				t.Fatal(err)
			}
			gone := []string{
				filepath.Join(n.SysfsRoot, "class/infiniband", tt.ib), ibdir,
				filepath.Join(n.SysfsRoot, "class/infiniband_verbs", tt.uverbs),
				filepath.Join(n.DevRoot, "infiniband", tt.uverbs),
			}
			for _, m := range tt.mad {
				gone = append(gone, filepath.Join(n.SysfsRoot, "class/infiniband_mad", m), filepath.Join(n.DevRoot, "infiniband", m))
			}
			for _, p := range gone {
				if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s still exists (%v)", p, err)
				}
			}
			if pci != "" {
				for _, sub := range []string{"infiniband", "infiniband_verbs", "infiniband_mad"} {
					if _, err := os.Stat(filepath.Join(pci, sub)); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("empty %s/%s left behind", pci, sub)
					}
				}
				if _, err := os.Stat(filepath.Join(pci, "vendor")); err != nil {
					t.Errorf("PCI function went away: %v", err)
				}
			}
			for path := range n.Faults {
				if strings.HasPrefix(path, ibdir+"/") {
					t.Errorf("fault %s survives", path)
					break
				}
			}
			if len(n.Spec.HCAs) != before-1 || n.IBDevDir(tt.ib) != "" {
				t.Errorf("Spec still lists %s", tt.ib)
			}
			if err := n.RemoveHCA(tt.ib); err == nil {
				t.Errorf("second RemoveHCA succeeded")
			}
			checkTree(t, n)
		})
	}
}

func TestRenameNetdev(t *testing.T) {
	t.Parallel()
	t.Run("hardware", func(t *testing.T) {
		t.Parallel()
		n := buildPreset(t, "dgx-h100")
		if err := n.RenameNetdev("ens1f0np0", "roce0"); err != nil {
			t.Fatal(err)
		}
		pci := n.PCIDir("mlx5_8")
		sameFile(t, filepath.Join(n.SysfsRoot, "class/net/roce0"), filepath.Join(pci, "net/roce0"))
		for _, p := range []string{filepath.Join(n.SysfsRoot, "class/net/ens1f0np0"), filepath.Join(pci, "net/ens1f0np0")} {
			if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s still exists", p)
			}
		}
		for i := 0; i < 4; i++ {
			wantContent(t, filepath.Join(n.IBDevDir("mlx5_8"), "ports/1/gid_attrs/ndevs", fmt.Sprint(i)), "roce0")
		}
		wantContent(t, filepath.Join(n.IBDevDir("mlx5_9"), "ports/1/gid_attrs/ndevs/0"), "ens1f1np1")
		if h := n.Spec.HCAs[8]; h.Netdevs[0] != "roce0" || h.Ports[0].GIDs[0].Netdev != "roce0" {
			t.Errorf("Spec not updated: %v %+v", h.Netdevs, h.Ports[0].GIDs[0])
		}
		checkTree(t, n)
	})
	t.Run("software parent", func(t *testing.T) {
		t.Parallel()
		n := buildPreset(t, "softroce")
		if err := n.RenameNetdev("eth0", "enp1s0"); err != nil {
			t.Fatal(err)
		}
		sameFile(t, filepath.Join(n.SysfsRoot, "class/net/enp1s0"), filepath.Join(n.SysfsRoot, "devices/virtual/net/enp1s0"))
		wantContent(t, filepath.Join(n.SysfsRoot, "class/infiniband/rxe0/ports/1/gid_attrs/ndevs/1"), "enp1s0")
		wantContent(t, filepath.Join(n.SysfsRoot, "class/infiniband/rxe0/parent"), "enp1s0")
		checkTree(t, n)
	})
	t.Run("errors", func(t *testing.T) {
		t.Parallel()
		n := buildPreset(t, "dgx-h100")
		for _, tt := range [][2]string{{"nope", "x"}, {"ibp22s0", "ibp23s0"}, {"ibp22s0", "../x"}, {"ibp22s0", ""}} {
			if err := n.RenameNetdev(tt[0], tt[1]); err == nil {
				t.Errorf("RenameNetdev(%q, %q) succeeded", tt[0], tt[1])
			}
		}
	})
}

func TestBuildErrors(t *testing.T) {
	t.Parallel()
	good := func() HCASpec {
		s, _ := Preset("broken")
		return s.HCAs[0]
	}
	tests := []struct {
		name   string
		mutate func(s *Spec)
		want   string
	}{
		{"empty name", func(s *Spec) { s.HCAs[0].Name = "" }, "invalid name"},
		{"slash in name", func(s *Spec) { s.HCAs[0].Name = "a/b" }, "invalid name"},
		{"duplicate name", func(s *Spec) { s.HCAs = append(s.HCAs, s.HCAs[0]) }, "duplicate name"},
		{"duplicate uverbs", func(s *Spec) { s.HCAs[1].Uverbs = 0 }, "uverbs0 already used"},
		{"duplicate umad", func(s *Spec) { s.HCAs[1].Ports[0].UMAD = 0 }, "umad0 already used"},
		{"gid out of table", func(s *Spec) { s.HCAs[0].Ports[0].GIDs[0].Index = 16 }, "GID index 16"},
		{"bad path", func(s *Spec) { s.HCAs[0].PCI.Path = []string{"0000:01:00.0"} }, "PCI path"},
		{"path not ending in bus", func(s *Spec) { s.HCAs[0].PCI.Path = []string{"pci0000:00", "0000:02:00.0"} }, "PCI path"},
		{"dotdot in path", func(s *Spec) { s.HCAs[0].PCI.Path = []string{"pci0000:00", "..", "0000:01:00.0"} }, "invalid PCI path element"},
		{"duplicate bus", func(s *Spec) { s.HCAs[1].PCI = s.HCAs[0].PCI }, "already belongs"},
		{"duplicate netdev", func(s *Spec) { s.HCAs[1].Netdevs = s.HCAs[0].Netdevs }, "already belongs"},
		{"unknown VF", func(s *Spec) { s.HCAs[0].PCI.TotalVFs, s.HCAs[0].PCI.VFs = 8, []string{"0000:01:00.1"} }, "VF 0000:01:00.1"},
		{"too many VFs", func(s *Spec) { s.HCAs[0].PCI.VFs = []string{"0000:02:00.0"} }, "sriov_totalvfs 0"},
		{"unknown PF", func(s *Spec) { s.HCAs[0].PCI.PF = "0000:09:00.0" }, "PF 0000:09:00.0"},
		{"corrupt escapes", func(s *Spec) { s.HCAs[0].Corrupt = map[string]string{"../../x": "y"} }, "bad Corrupt key"},
		{"corrupt pci of software", func(s *Spec) { s.HCAs[0].PCI = nil; s.HCAs[0].Corrupt = map[string]string{"pci:vendor": ""} }, "bad Corrupt key"},
		{"corrupt removes nothing", func(s *Spec) { s.HCAs[0].Corrupt = map[string]string{"nope": ""} }, "nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := Spec{HCAs: []HCASpec{good(), good()}}
			s.HCAs[1].Name, s.HCAs[1].Uverbs, s.HCAs[1].Ports[0].UMAD = "mlx5_1", 1, 1
			s.HCAs[1].Netdevs = []string{"ibp2s0"}
			s.HCAs[1].PCI.BusID = "0000:02:00.0"
			s.HCAs[1].PCI.Path = []string{"pci0000:00", "0000:00:02.0", "0000:02:00.0"}
			if _, err := Build(t.TempDir(), s); err != nil {
				t.Fatalf("base spec: %v", err)
			}
			tt.mutate(&s)
			_, err := Build(t.TempDir(), s)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Build: %v, want an error containing %q", err, tt.want)
			}
		})
	}

	t.Run("twice into one dir", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		if _, err := Build(dir, Spec{}); err != nil {
			t.Fatal(err)
		}
		if _, err := Build(dir, Spec{}); err == nil || !strings.Contains(err.Error(), "already exists") {
			t.Errorf("second Build: %v", err)
		}
	})
}

func TestBuildDoesNotAliasSpec(t *testing.T) {
	t.Parallel()
	s, _ := Preset("dgx-h100")
	n, err := Build(t.TempDir(), s)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.SetPortState("mlx5_0", 1, "1: DOWN", "3: Disabled"); err != nil {
		t.Fatal(err)
	}
	if s.HCAs[0].Ports[0].State != "4: ACTIVE" {
		t.Errorf("mutation leaked into the caller's spec")
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	n, err := Build(t.TempDir(), Spec{HCAs: []HCASpec{{Name: "mlx5_0", Ports: []PortSpec{{UMAD: -1}}, Uverbs: -1}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := n.IBDevDir("mlx5_0")
	wantContent(t, filepath.Join(dir, "node_type"), "1: CA")
	wantContent(t, filepath.Join(dir, "ports/1/state"), "4: ACTIVE")
	wantContent(t, filepath.Join(dir, "ports/1/link_layer"), "InfiniBand")
	gids, _ := os.ReadDir(filepath.Join(dir, "ports/1/gids"))
	if len(gids) != defaultGIDTableLen {
		t.Errorf("%d GID slots, want %d", len(gids), defaultGIDTableLen)
	}
}

func TestPresetLookup(t *testing.T) {
	t.Parallel()
	names := PresetNames()
	if !slices.IsSorted(names) {
		t.Errorf("PresetNames not sorted: %v", names)
	}
	for _, name := range names {
		if _, err := Preset(name); err != nil {
			t.Errorf("Preset(%s): %v", name, err)
		}
	}
	_, err := Preset("dgx-a100")
	if err == nil || !strings.Contains(err.Error(), `"dgx-a100"`) || !strings.Contains(err.Error(), strings.Join(names, ", ")) {
		t.Errorf("unknown preset error %v should name it and list %v", err, names)
	}
}

func TestSynthetic(t *testing.T) {
	t.Parallel()
	for _, count := range []int{0, 1, 8, 64} {
		t.Run(fmt.Sprint(count), func(t *testing.T) {
			t.Parallel()
			s := Synthetic(count)
			if len(s.HCAs) != count {
				t.Fatalf("%d HCAs, want %d", len(s.HCAs), count)
			}
			numa := map[int]int{}
			roots := map[string]int{}
			for _, h := range s.HCAs {
				numa[h.PCI.NUMANode]++
				roots[h.PCI.Path[0]]++
			}
			if count >= 4 && (numa[0] == 0 || numa[1] == 0 || len(numa) != 2) {
				t.Errorf("NUMA spread %v, want two nodes", numa)
			}
			for r, k := range roots {
				if k > 2 {
					t.Errorf("root %s has %d HCAs", r, k)
				}
			}
			n, err := Build(t.TempDir(), s)
			if err != nil {
				t.Fatal(err)
			}
			if count == 64 {
				wantContent(t, filepath.Join(n.SysfsRoot, "class/infiniband_verbs/uverbs40/dev"), "243:8")
				wantContent(t, filepath.Join(n.SysfsRoot, "class/infiniband_mad/umad63/dev"), "231:63")
				wantContent(t, filepath.Join(n.SysfsRoot, "class/infiniband_mad/issm63/dev"), "231:127")
				sameFile(t, filepath.Join(n.SysfsRoot, "class/net/ibP1p1s0"), filepath.Join(n.PCIDir("mlx5_16"), "net/ibP1p1s0"))
			}
		})
	}
}

func BenchmarkBuild(b *testing.B) {
	for _, bc := range []struct {
		name string
		spec func() Spec
	}{
		{"dgx-h100", dgxH100},
		{"synthetic-64", func() Spec { return Synthetic(64) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			spec := bc.spec()
			root := b.TempDir()
			i := 0
			for b.Loop() {
				if _, err := Build(filepath.Join(root, fmt.Sprint(i)), spec); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

func TestNetlink(t *testing.T) {
	t.Parallel()
	n := buildPreset(t, "roce-sriov")
	if err := n.SetPortState("mlx5_2", 1, "1: DOWN", "3: Disabled"); err != nil {
		t.Fatal(err)
	}
	if mode, err := n.Netlink().NetnsMode(); err != nil || mode != rdmanl.NetnsExclusive {
		t.Errorf("netns mode %v, %v; want exclusive", mode, err)
	}
	links, err := n.Netlink().Links()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 6 {
		t.Fatalf("%d links, want 6", len(links))
	}
	for i, l := range links {
		h := n.Spec.HCAs[i]
		if l.DevIndex != uint32(i) || l.DevName != h.Name || l.Index != 1 || l.Netdev != h.Netdevs[0] {
			t.Errorf("link %d = %+v", i, l)
		}
		// The ifindex is the one sysfs shows.
		wantContent(t, filepath.Join(n.SysfsRoot, "class/net", l.Netdev, "ifindex"), fmt.Sprint(l.NetdevIndex))
	}
	if l := links[2]; l.State != 1 || l.PhysState != 3 {
		t.Errorf("mlx5_2 after SetPortState: state %d/%d, want 1/3", l.State, l.PhysState)
	}
	if l := links[0]; l.State != 4 || l.PhysState != 5 {
		t.Errorf("mlx5_0: state %d/%d, want 4/5", l.State, l.PhysState)
	}

	// From a pod's namespace in exclusive mode: nothing.
	spec, _ := Preset("roce-sriov")
	spec.ForeignNetns = true
	foreign, err := Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if links, err := foreign.Netlink().Links(); err != nil || len(links) != 0 {
		t.Errorf("foreign namespace: %d links, %v; want none", len(links), err)
	}
	if entries, _ := os.ReadDir(filepath.Join(foreign.SysfsRoot, "class/infiniband")); len(entries) != 0 {
		t.Errorf("foreign namespace: class/infiniband lists %d devices, want none", len(entries))
	}
	if _, err := os.Stat(filepath.Join(foreign.PCIDir("mlx5_0"), "infiniband")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("foreign namespace: the ibdev glue dir is visible (%v)", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(foreign.SysfsRoot, "class/infiniband_verbs")); len(entries) != 7 {
		t.Errorf("foreign namespace: class/infiniband_verbs has %d entries, want 6 devices and abi_version", len(entries))
	}
	if err := foreign.SetPortState("mlx5_0", 1, "1: DOWN", "3: Disabled"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(foreign.IBDevDir("mlx5_0")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("SetPortState made the hidden ibdev dir")
	}
	checkTree(t, foreign)
}

// pciFile reads a file of the PCI function bdf through bus/pci/devices.
func pciFile(t *testing.T, n *Node, bdf, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.SysfsRoot, "bus", "pci", "devices", bdf, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// realPath is where bus/pci/devices/<bdf> leads, under devices/.
func realPath(t *testing.T, n *Node, bdf string) string {
	t.Helper()
	real, err := filepath.EvalSymlinks(filepath.Join(n.SysfsRoot, "bus", "pci", "devices", bdf))
	if err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(filepath.Join(n.realSys, "devices"), real)
	return rel
}

// acsControl reads the ACS Control Register by walking the config file's
// extended capabilities (-1: no ACS capability).
func acsControl(t *testing.T, config []byte) int {
	t.Helper()
	if len(config) != 4096 {
		t.Fatalf("config has %d bytes, want 4096", len(config))
	}
	for off := 0x100; off != 0; {
		hdr := uint32(config[off]) | uint32(config[off+1])<<8 | uint32(config[off+2])<<16 | uint32(config[off+3])<<24
		if hdr&0xffff == 0x000d {
			return int(config[off+6]) | int(config[off+7])<<8
		}
		off = int(hdr >> 20)
	}
	return -1
}

func checkGB200(t *testing.T, n *Node) {
	for bdf, want := range map[string]struct{ path, modalias, numa string }{
		"0000:01:00.0": {"pci0000:00/0000:00:00.0/0000:01:00.0", "pci:v000015B3d00001021sv000015B3sd00000041bc02sc07i00", "0"},
		"0012:01:00.0": {"pci0012:00/0012:00:00.0/0012:01:00.0", "pci:v000015B3d00001021sv000015B3sd00000041bc02sc07i00", "1"},
		"0008:01:00.0": {"pci0008:00/0008:00:00.0/0008:01:00.0", "pci:v000010DEd00002901sv000010DEsd000016C1bc03sc02i00", "0"},
		"0019:01:00.0": {"pci0019:00/0019:00:00.0/0019:01:00.0", "pci:v000010DEd00002901sv000010DEsd000016C1bc03sc02i00", "1"},
		"0008:00:00.0": {"pci0008:00/0008:00:00.0", "pci:v000010DEd000022B1sv00000000sd00000000bc06sc04i00", "0"},
	} {
		if got := realPath(t, n, bdf); got != want.path {
			t.Errorf("%s is at %s, want %s", bdf, got, want.path)
		}
		if got := strings.TrimSpace(string(pciFile(t, n, bdf, "modalias"))); got != want.modalias {
			t.Errorf("%s modalias %s, want %s", bdf, got, want.modalias)
		}
		if got := strings.TrimSpace(string(pciFile(t, n, bdf, "numa_node"))); got != want.numa {
			t.Errorf("%s numa_node %s, want %s", bdf, got, want.numa)
		}
	}
	if got := acsControl(t, pciFile(t, n, "0008:00:00.0", "config")); got != 0x1d {
		t.Errorf("Grace root port ACS control %#x, want the kernel default 0x1d", got)
	}
	if !bytes.Contains(pciFile(t, n, "0002:01:00.0", "vpd"), []byte("SN\x0cMT2430X00001")) {
		t.Errorf("mlx5_1's VPD lacks its serial")
	}
}

func checkGB300(good bool) func(t *testing.T, n *Node) {
	return func(t *testing.T, n *Node) {
		for bdf, path := range map[string]string{
			"0000:01:00.0": "pci0000:00/0000:00:00.0/0000:01:00.0",
			"0008:03:00.0": "pci0008:00/0008:00:00.0/0008:01:00.0/0008:02:00.0/0008:03:00.0",
			"0008:06:00.0": "pci0008:00/0008:00:00.0/0008:01:00.0/0008:02:01.0/0008:04:00.0/0008:05:00.0/0008:06:00.0",
		} {
			if got := realPath(t, n, bdf); got != path {
				t.Errorf("%s is at %s, want %s", bdf, got, path)
			}
		}
		for bdf, want := range map[string]string{
			"0000:01:00.0": "pci:v000015B3d00001023sv000015B3sd00000026bc02sc07i00",
			"0008:03:00.0": "pci:v000015B3d00002100sv000015B3sd00000026bc08sc80i00",
			"0008:01:00.0": "pci:v000015B3d0000197Csv00000000sd00000000bc06sc04i00",
			"0008:06:00.0": "pci:v000010DEd00003182sv000010DEsd000016C1bc03sc02i00",
		} {
			if got := strings.TrimSpace(string(pciFile(t, n, bdf, "modalias"))); got != want {
				t.Errorf("%s modalias %s, want %s", bdf, got, want)
			}
		}
		// PF and DMA function: one card, one V3, one serial for the socket's two cards.
		pf, dma := pciFile(t, n, "0000:01:00.0", "vpd"), pciFile(t, n, "0008:03:00.0", "vpd")
		if !bytes.Equal(pf, dma) || !bytes.Contains(pf, []byte("V3\x209e3b5c714a2f11f0b000c470bd8a0000")) || !bytes.Contains(pf, []byte("SN\x0cMT2516X00000")) {
			t.Errorf("PF and DMA function VPDs differ or lack V3/SN:\n%q\n%q", pf, dma)
		}
		if !bytes.Contains(pciFile(t, n, "0002:01:00.0", "vpd"), []byte("SN\x0cMT2516X00000")) {
			t.Errorf("mlx5_1 is not on mlx5_0's board")
		}
		var sum byte
		for _, c := range pf[:len(pf)-1] {
			sum += c
		}
		if sum != 0 || pf[len(pf)-1] != 0x78 {
			t.Errorf("VPD checksum sums to %#x (want 0) or no end tag: %q", sum, pf)
		}
		want := map[string]int{"0008:00:00.0": 0x1c, "0008:01:00.0": -1, "0008:02:00.0": 0x19, "0008:02:01.0": 0x15, "0008:04:00.0": -1, "0008:05:00.0": 0x1d, "0000:00:00.0": 0x1d}
		if !good {
			want["0008:00:00.0"], want["0008:02:00.0"], want["0008:02:01.0"] = 0x1d, 0x1d, 0x1d
		}
		for bdf, w := range want {
			if got := acsControl(t, pciFile(t, n, bdf, "config")); got != w {
				t.Errorf("%s ACS control %#x, want %#x", bdf, got, w)
			}
		}
		cfg := pciFile(t, n, "0008:02:00.0", "config")
		if cfg[0x0e] != 1 || cfg[0x19] != 0x03 || cfg[0x1a] != 0x03 || cfg[0x42]>>4 != 0x6 {
			t.Errorf("DSP 0008:02:00.0 header: type %d, buses %#x-%#x, port type %d; want a type 1 downstream port to bus 3", cfg[0x0e], cfg[0x19], cfg[0x1a], cfg[0x42]>>4)
		}
		group := func(bdf string) string {
			target, err := os.Readlink(filepath.Join(n.SysfsRoot, "bus", "pci", "devices", bdf, "iommu_group"))
			if err != nil {
				t.Fatal(err)
			}
			return filepath.Base(target)
		}
		if same := group("0008:03:00.0") == group("0008:06:00.0"); same != good {
			t.Errorf("DMA function and GPU share an IOMMU group: %v, want %v", same, good)
		}
	}
}
