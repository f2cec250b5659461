package hca

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// materialize writes a kernel listing (see testdata/kernel-node.txt) under
// dir/sys and dir/dev, and returns a reader that fails like the kernel on
// the listing's E lines.
func materialize(t *testing.T, listing, dir string) (sysfs, dev string, read func(string) ([]byte, error)) {
	t.Helper()
	sysfs, dev = filepath.Join(dir, "sys"), filepath.Join(dir, "dev")
	faults := map[string]syscall.Errno{}
	f, err := os.Open(listing)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		kind, rest, _ := strings.Cut(text, " ")
		path, arg, _ := strings.Cut(rest, " ")
		full := filepath.Join(sysfs, path)
		if kind == "C" {
			full = filepath.Join(dev, path)
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		switch kind {
		case "D":
			err = os.MkdirAll(full, 0o755)
		case "F":
			err = os.WriteFile(full, []byte(arg+"\n"), 0o444)
		case "L":
			err = os.Symlink(arg, full)
		case "E":
			err = os.WriteFile(full, nil, 0o444)
			faults[full] = map[string]syscall.Errno{"EINVAL": syscall.EINVAL, "ENODATA": syscall.ENODATA}[arg]
		case "C":
			err = mknodOrFile(full, arg)
		default:
			err = fmt.Errorf("unknown kind %q", kind)
		}
		if err != nil {
			t.Fatalf("%s:%d: %v", listing, line, err)
		}
	}
	read = func(p string) ([]byte, error) {
		if errno, ok := faults[p]; ok {
			return nil, &fs.PathError{Op: "read", Path: p, Err: errno}
		}
		return os.ReadFile(p)
	}
	return sysfs, dev, read
}

func mknodOrFile(path, majmin string) error {
	if os.Geteuid() != 0 {
		return os.WriteFile(path, nil, 0o666)
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(majmin, "%d:%d", &major, &minor); err != nil {
		return err
	}
	dev := (major&0xfff)<<8 | (minor & 0xff) | (minor&^0xff)<<12
	return syscall.Mknod(path, syscall.S_IFCHR|0o666, int(dev))
}

// TestDiscoverKernelListing checks discovery against a tree that pkg/hca/hcatest
// did not write, value by value.
func TestDiscoverKernelListing(t *testing.T) {
	sysfs, dev, read := materialize(t, "testdata/kernel-node.txt", t.TempDir())
	inv, err := Discover(WithSysfsRoot(sysfs), WithDevRoot(dev), WithReadFile(read))
	if err != nil {
		t.Fatal(err)
	}
	mad := func(name string, maj, min uint32) CharDevice {
		return CharDevice{Name: name, Path: "/dev/infiniband/" + name, Major: maj, Minor: min, Port: 1, Exists: true}
	}
	uverbs := func(n uint32) *CharDevice {
		name := fmt.Sprintf("uverbs%d", n)
		return &CharDevice{Name: name, Path: "/dev/infiniband/" + name, Major: 231, Minor: 192 + n, Exists: true}
	}
	cx5 := func(name, guid string) HCA {
		return HCA{Identity: Identity{NodeType: "CA", NodeGUID: guid, SysImageGUID: "b859:9f03:0012:3a48", FirmwareVer: "16.35.4030", HCAType: "MT4119", BoardID: "MT_0000000008", NodeDesc: "gpu-node-7 " + name, Model: "ConnectX-5"}, Name: name,

			Usable: true}
	}
	rocePort := func(state, phys string, gbps float64, speed, gid, ndev string, roce int, extra ...GID) []Port {
		gids := []GID{{0, gid, "IB/RoCE v1", ndev}, {1, gid, "RoCE v2", ndev}}
		return []Port{{Number: 1, State: state, PhysState: phys, LinkLayer: LinkLayerEthernet, RateGbps: gbps,
			Width: "4X", Speed: speed, GIDs: append(gids, extra...), RoCEv2GIDIndex: roce}}
	}

	f0 := cx5("rocep59s0f0", "b859:9f03:0012:3a48")
	f0.Ports = rocePort("ACTIVE", "LinkUp", 100, "EDR", "fe80:0000:0000:0000:ba59:9fff:fe12:3a48", "enp59s0f0np0", 3,
		GID{2, "0000:0000:0000:0000:0000:ffff:c0a8:6407", "IB/RoCE v1", "enp59s0f0np0"},
		GID{3, "0000:0000:0000:0000:0000:ffff:c0a8:6407", "RoCE v2", "enp59s0f0np0"})
	f0.Uverbs = uverbs(0)
	f0.MAD = []CharDevice{mad("issm0", 231, 64), mad("umad0", 231, 0)}
	f0.PCI = &PCIInfo{BusID: "0000:3b:00.0", VendorID: "15b3", DeviceID: "1017", SubsystemVendor: "15b3",
		SubsystemDevice: "0008", Driver: "mlx5_core", NUMANode: 1, PCIeRoot: "pci0000:3a", SRIOV: SRIOVPF, NumVFs: 1}
	f0.Netdevs = []string{"enp59s0f0np0"}

	f1 := cx5("rocep59s0f1", "b859:9f03:0012:3a49")
	f1.Ports = rocePort("DOWN", "Disabled", 40, "QDR", "fe80:0000:0000:0000:ba59:9fff:fe12:3a49", "enp59s0f1np1", -1)
	f1.Uverbs = uverbs(2)
	f1.PCI = &PCIInfo{BusID: "0000:3b:00.1", VendorID: "15b3", DeviceID: "1017", SubsystemVendor: "15b3",
		SubsystemDevice: "0008", Driver: "mlx5_core", NUMANode: 1, PCIeRoot: "pci0000:3a", SRIOV: SRIOVPF}
	f1.Netdevs = []string{"enp59s0f1np1"}

	vf := cx5("rocep59s0f0v0", "0000:0000:0000:0000")
	vf.HCAType, vf.Model = "MT4120", "ConnectX-5 VF"
	vf.Ports = rocePort("ACTIVE", "LinkUp", 100, "EDR", "fe80:0000:0000:0000:582e:11ff:fe90:0001", "enp59s0f0v0", 3,
		GID{2, "2001:0db8:0064:0000:0000:0000:0000:0021", "IB/RoCE v1", "enp59s0f0v0"},
		GID{3, "2001:0db8:0064:0000:0000:0000:0000:0021", "RoCE v2", "enp59s0f0v0"})
	vf.Uverbs = uverbs(3)
	vf.PCI = &PCIInfo{BusID: "0000:3b:00.2", VendorID: "15b3", DeviceID: "1018", SubsystemVendor: "15b3",
		SubsystemDevice: "0080", Driver: "mlx5_core", NUMANode: -1, PCIeRoot: "pci0000:3a", SRIOV: SRIOVVF, PFBusID: "0000:3b:00.0"}
	vf.Netdevs = []string{"enp59s0f0v0"}
	// No GPU in this listing: each data path is the HCA's own function.
	f0.DataPath = &DataPath{Function: "0000:3b:00.0", PCIeRoot: "pci0000:3a"}
	f1.DataPath = &DataPath{Function: "0000:3b:00.1", PCIeRoot: "pci0000:3a"}
	vf.DataPath = &DataPath{Function: "0000:3b:00.2", PCIeRoot: "pci0000:3a"}

	want := Inventory{
		NetnsMode: NetnsExclusive, NetnsModeSource: SourceSysfs,
		RDMACM: &CharDevice{Name: "rdma_cm", Path: "/dev/infiniband/rdma_cm", Major: 10, Minor: 122, Exists: true},
		HCAs: []HCA{
			{
				Name: "ibp12s0",
				Identity: Identity{NodeType: "CA", NodeGUID: "b859:9f03:00c1:7e02", SysImageGUID: "b859:9f03:00c1:7e02",
					FirmwareVer: "20.35.1012", HCAType: "MT4123", BoardID: "MT_0000000223", NodeDesc: "gpu-node-7 ibp12s0",
					Model: "ConnectX-6"},
				Ports: []Port{{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: LinkLayerInfiniBand,
					RateGbps: 200, Width: "4X", Speed: "HDR", LID: 0x2b, SMLID: 1, RoCEv2GIDIndex: -1,
					GIDs: []GID{{0, "fe80:0000:0000:0000:b859:9f03:00c1:7e02", "IB/RoCE v1", ""}}}},
				Uverbs: uverbs(1),
				MAD:    []CharDevice{mad("issm1", 231, 65), mad("umad1", 231, 1)},
				PCI: &PCIInfo{BusID: "0000:0c:00.0", VendorID: "15b3", DeviceID: "101b", SubsystemVendor: "15b3",
					SubsystemDevice: "0007", Driver: "mlx5_core", NUMANode: 0, PCIeRoot: "pci0000:00"},
				DataPath: &DataPath{Function: "0000:0c:00.0", PCIeRoot: "pci0000:00"},
				Netdevs:  []string{"ibp12s0"},
				Usable:   true,
			},
			f0, vf, f1,
		},
	}
	if diff := cmp.Diff(want, inv); diff != "" {
		t.Errorf("discovery mismatch (-want +got):\n%s", diff)
	}
}
