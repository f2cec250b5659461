package hcatest

import (
	"fmt"
	"sort"
	"strings"
)

// presets are functions so every caller gets its own slices.
var presets = map[string]func() Spec{
	"dgx-h100":      dgxH100,
	"gb200":         gb200,
	"gb300":         func() Spec { return gb300(true) },
	"gb300-acs-bad": func() Spec { return gb300(false) },
	"roce-sriov":    roceSRIOV,
	"softroce":      softRoCE,
	"rxe":           rxe,
	"siw":           siw,
	"vm":            vm,
	"empty":         empty,
	"broken":        broken,
}

// Preset returns a named node spec; PresetNames lists them.
func Preset(name string) (Spec, error) {
	f, ok := presets[name]
	if !ok {
		return Spec{}, fmt.Errorf("hcatest: unknown preset %q (valid: %s)", name, strings.Join(PresetNames(), ", "))
	}
	return f(), nil
}

// PresetNames returns the preset names, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Link-layer names as the kernel writes them.
const (
	ib  = "InfiniBand"
	eth = "Ethernet"
)

const (
	gidV1 = "IB/RoCE v1"
	gidV2 = "RoCE v2"
)

// linkLocalGID is the IB port GID 0: the fe80 prefix then the port GUID.
func linkLocalGID(guid string) string { return "fe80:0000:0000:0000:" + guid }

// eui64GID is the RoCE default GID: the IPv6 link-local address of a MAC.
func eui64GID(mac [6]byte) string {
	return fmt.Sprintf("fe80:0000:0000:0000:%02x%02x:%02xff:fe%02x:%02x%02x", mac[0]^0x02, mac[1], mac[2], mac[3], mac[4], mac[5])
}

// ipv4GID is an IPv4 address as the kernel prints its GID (IPv4-mapped).
func ipv4GID(a, b, c, d byte) string {
	return fmt.Sprintf("0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", a, b, c, d)
}

// mlx5EthGUID is the node GUID mlx5 derives from a port MAC (03:00 inserted).
func mlx5EthGUID(mac [6]byte) string {
	return fmt.Sprintf("%02x%02x:%02x03:00%02x:%02x%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5])
}

// roceGIDs is a RoCE port's table as the kernel fills it: the link-local
// GID as v1 and v2, then (when ip is set) the IPv4 address as v1 and v2.
func roceGIDs(mac [6]byte, ip []byte, netdev string) []GIDSpec {
	ll := eui64GID(mac)
	gids := []GIDSpec{{0, ll, gidV1, netdev}, {1, ll, gidV2, netdev}}
	if ip != nil {
		v4 := ipv4GID(ip[0], ip[1], ip[2], ip[3])
		gids = append(gids, GIDSpec{2, v4, gidV1, netdev}, GIDSpec{3, v4, gidV2, netdev})
	}
	return gids
}

// pciPath is a function behind one bridge of a root complex.
func pciPath(root, bridge, fn string) []string { return []string{root, bridge, fn} }

// cx7 is a single-port ConnectX-7 NDR InfiniBand HCA (OSFP, one function):
// netdev ibp<bus>s0 (or ibP<domain>p<bus>s0), uverbs and umad index idx;
// its P_Key table holds the default 0xffff and the partition 0x8001 at 1.
func cx7(name, guid string, path []string, numa, idx int, lid uint16) HCASpec {
	bus := path[len(path)-1]
	var domain, busNum int
	_, _ = fmt.Sscanf(bus, "%x:%x:", &domain, &busNum) // our own bus IDs
	netdev := fmt.Sprintf("ibp%ds0", busNum)
	if domain != 0 {
		netdev = fmt.Sprintf("ibP%dp%ds0", domain, busNum)
	}
	return HCASpec{
		Name: name, NodeType: "1: CA",
		NodeGUID: guid, SysImageGUID: guid,
		FWVer: "28.39.2048", HCAType: "MT4129", BoardID: "MT_0000000838",
		Ports: []PortSpec{{
			State: "4: ACTIVE", PhysState: "5: LinkUp", LinkLayer: ib,
			Rate: "400 Gb/sec (4X NDR)", LID: lid, SMLID: 0x1,
			GIDs:  []GIDSpec{{Index: 0, GID: linkLocalGID(guid), Type: gidV1}},
			PKeys: []string{"0xffff", "0x8001"},
			UMAD:  idx,
		}},
		PCI: &PCISpec{
			BusID: bus, Path: path,
			Vendor: "15b3", Device: "1021", SubsystemVendor: "15b3", SubsystemDevice: "0041",
			Driver: "mlx5_core", NUMANode: numa,
		},
		Uverbs:  idx,
		Netdevs: []string{netdev},
	}
}

// dgxH100 is a DGX H100-like node "dgx01": eight ConnectX-7 NDR IB HCAs
// mlx5_0..7, two per PCIe root, each behind its own bridge:
//
//	mlx5_0 pci0000:15/0000:15:01.0/0000:16:00.0 ibp22s0   NUMA 0
//	mlx5_1 pci0000:15/0000:15:02.0/0000:17:00.0 ibp23s0   NUMA 0
//	mlx5_2 pci0000:3e/0000:3e:01.0/0000:3f:00.0 ibp63s0   NUMA 0
//	mlx5_3 pci0000:3e/0000:3e:02.0/0000:40:00.0 ibp64s0   NUMA 0
//	mlx5_4 pci0000:9a/0000:9a:01.0/0000:9b:00.0 ibp155s0  NUMA 1
//	mlx5_5 pci0000:9a/0000:9a:02.0/0000:9c:00.0 ibp156s0  NUMA 1
//	mlx5_6 pci0000:c0/0000:c0:01.0/0000:c1:00.0 ibp193s0  NUMA 1
//	mlx5_7 pci0000:c0/0000:c0:02.0/0000:c2:00.0 ibp194s0  NUMA 1
//
// node GUID a088:c203:0012:3a40 + 0x10*i, LID 0x1a+i, SM LID 0x1, GID 0 the
// link-local fe80::<GUID>; uverbsI, umadI/issmI. Plus a BlueField-3
// (15b3:a2dc) with two RoCE functions on pci0000:d0/0000:d0:01.0, NUMA 1:
// mlx5_8 = 0000:d1:00.0 ens1f0np0 (MAC b8:3f:d2:9a:40:e0, 10.0.0.1) and
// mlx5_9 = 0000:d1:00.1 ens1f1np1 (…:e1, 10.0.1.1), sharing a system image
// GUID, GIDs 0/1 link-local v1/v2 and 2/3 IPv4 v1/v2; uverbs8/9, umad8/9.
// rdma_cm is 10:58, netns mode shared. Beside each root's two HCAs sit two
// H100 SXM5 GPUs (10de:2330, 3D controller), each behind its own root port
// <bus>:03.0 and <bus>:04.0: 0000:18:00.0 and 0000:19:00.0 on pci0000:15,
// 41/42 on pci0000:3e, 9d/9e on pci0000:9a, c3/c4 on pci0000:c0. A GPU and
// an HCA share only the root complex (no switch, no ACS written).
func dgxH100() Spec {
	s := Spec{Hostname: "dgx01", NetnsShared: true, RDMACMMinor: 58}
	roots := []struct {
		root string
		bus  int
		numa int
	}{{"pci0000:15", 0x15, 0}, {"pci0000:3e", 0x3e, 0}, {"pci0000:9a", 0x9a, 1}, {"pci0000:c0", 0xc0, 1}}
	for i := 0; i < 8; i++ {
		r, j := roots[i/2], i%2
		path := pciPath(r.root,
			fmt.Sprintf("0000:%02x:%02x.0", r.bus, j+1),
			fmt.Sprintf("0000:%02x:00.0", r.bus+1+j))
		guid := fmt.Sprintf("a088:c203:0012:%04x", 0x3a40+0x10*i)
		s.HCAs = append(s.HCAs, cx7(fmt.Sprintf("mlx5_%d", i), guid, path, r.numa, i, uint16(0x1a+i)))
		gpu := r.bus + 3 + j
		s.Devices = append(s.Devices, nvidiaGPU("2330",
			pciPath(r.root, fmt.Sprintf("0000:%02x:%02x.0", r.bus, j+3), fmt.Sprintf("0000:%02x:00.0", gpu)), r.numa, ""))
	}
	for f := 0; f < 2; f++ {
		mac := [6]byte{0xb8, 0x3f, 0xd2, 0x9a, 0x40, 0xe0 + byte(f)}
		netdev := fmt.Sprintf("ens1f%dnp%d", f, f)
		bus := fmt.Sprintf("0000:d1:00.%d", f)
		s.HCAs = append(s.HCAs, HCASpec{
			Name: fmt.Sprintf("mlx5_%d", 8+f), NodeType: "1: CA",
			NodeGUID: mlx5EthGUID(mac), SysImageGUID: mlx5EthGUID([6]byte{0xb8, 0x3f, 0xd2, 0x9a, 0x40, 0xe0}),
			FWVer: "32.39.1002", HCAType: "MT41692", BoardID: "MT_0000000884",
			Ports: []PortSpec{{
				State: "4: ACTIVE", PhysState: "5: LinkUp", LinkLayer: eth,
				Rate: "200 Gb/sec (4X HDR)",
				GIDs: roceGIDs(mac, []byte{10, 0, byte(f), 1}, netdev),
				UMAD: 8 + f,
			}},
			PCI: &PCISpec{
				BusID: bus, Path: pciPath("pci0000:d0", "0000:d0:01.0", bus),
				Vendor: "15b3", Device: "a2dc", SubsystemVendor: "15b3", SubsystemDevice: "0051",
				Driver: "mlx5_core", NUMANode: 1,
			},
			Uverbs:  8 + f,
			Netdevs: []string{netdev},
		})
	}
	return s
}

// roceSRIOV is a RoCE node "roce01" in exclusive netns mode with one
// ConnectX-6 Dx (15b3:101d, MT4125) on pci0000:3a/0000:3a:02.0, NUMA 0:
//
//	mlx5_0 PF 0000:3b:00.0 enp59s0f0np0 ACTIVE 100G, 192.168.100.10, totalvfs 8, numvfs 4
//	mlx5_1 PF 0000:3b:00.1 enp59s0f1np1 DOWN/Disabled 40G, no IP, totalvfs 8, numvfs 0
//	mlx5_2..5 VFs of PF0 0000:3b:00.2..5 (15b3:101e, MT4126) enp59s0f0v0..3, 192.168.100.20..23
//
// uverbsI and umadI for mlx5_I; GUIDs from MACs 0c:42:a1:b1:c2:d0/d1 (PFs)
// and 0c:42:a1:b1:c2:e0..e3 (VFs); all share the PF0 system image GUID.
// rdma_cm is 10:59.
func roceSRIOV() Spec {
	s := Spec{Hostname: "roce01", NetnsShared: false, RDMACMMinor: 59}
	pfMAC := func(f int) [6]byte { return [6]byte{0x0c, 0x42, 0xa1, 0xb1, 0xc2, 0xd0 + byte(f)} }
	sysGUID := mlx5EthGUID(pfMAC(0))
	path := func(bus string) []string { return pciPath("pci0000:3a", "0000:3a:02.0", bus) }
	pf := func(f int, state, phys, rate string, ip []byte) HCASpec {
		bus := fmt.Sprintf("0000:3b:00.%d", f)
		netdev := fmt.Sprintf("enp59s0f%dnp%d", f, f)
		return HCASpec{
			Name: fmt.Sprintf("mlx5_%d", f), NodeType: "1: CA",
			NodeGUID: mlx5EthGUID(pfMAC(f)), SysImageGUID: sysGUID,
			FWVer: "22.36.1010", HCAType: "MT4125", BoardID: "MT_0000000359",
			Ports: []PortSpec{{
				State: state, PhysState: phys, LinkLayer: eth, Rate: rate,
				GIDs: roceGIDs(pfMAC(f), ip, netdev), UMAD: f,
			}},
			PCI: &PCISpec{
				BusID: bus, Path: path(bus),
				Vendor: "15b3", Device: "101d", SubsystemVendor: "15b3", SubsystemDevice: "0016",
				Driver: "mlx5_core", NUMANode: 0, TotalVFs: 8,
			},
			Uverbs: f, Netdevs: []string{netdev},
		}
	}
	pf0 := pf(0, "4: ACTIVE", "5: LinkUp", "100 Gb/sec (4X EDR)", []byte{192, 168, 100, 10})
	pf1 := pf(1, "1: DOWN", "3: Disabled", "40 Gb/sec (4X QDR)", nil)
	var vfs []HCASpec
	for v := 0; v < 4; v++ {
		mac := [6]byte{0x0c, 0x42, 0xa1, 0xb1, 0xc2, 0xe0 + byte(v)}
		bus := fmt.Sprintf("0000:3b:00.%d", 2+v)
		netdev := fmt.Sprintf("enp59s0f0v%d", v)
		pf0.PCI.VFs = append(pf0.PCI.VFs, bus)
		vfs = append(vfs, HCASpec{
			Name: fmt.Sprintf("mlx5_%d", 2+v), NodeType: "1: CA",
			NodeGUID: mlx5EthGUID(mac), SysImageGUID: sysGUID,
			FWVer: "22.36.1010", HCAType: "MT4126", BoardID: "MT_0000000359",
			Ports: []PortSpec{{
				State: "4: ACTIVE", PhysState: "5: LinkUp", LinkLayer: eth,
				Rate: "100 Gb/sec (4X EDR)",
				GIDs: roceGIDs(mac, []byte{192, 168, 100, byte(20 + v)}, netdev), UMAD: 2 + v,
			}},
			PCI: &PCISpec{
				BusID: bus, Path: path(bus),
				Vendor: "15b3", Device: "101e", SubsystemVendor: "15b3", SubsystemDevice: "0016",
				Driver: "mlx5_core", NUMANode: 0, PF: pf0.PCI.BusID,
			},
			Uverbs: 2 + v, Netdevs: []string{netdev},
		})
	}
	s.HCAs = append([]HCASpec{pf0, pf1}, vfs...)
	return s
}

// Soft-RoCE and soft-iWARP as Linux 6.1 (Debian bookworm) lays them out on
// a virtio-net VM (checked against the test/vm guest's sysfs):
// devices/virtual/infiniband/<ibdev> (no device link), fw_ver empty, no
// hca_type, board_id or hw_rev, rate "2.5 Gb/sec (1X SDR)" (the netdev's
// speed is unknown), node and system image GUID the EUI-64 of the MAC.
const (
	rxeGIDTableLen = 1024 // RXE_PORT_GID_TBL_LEN
	vmRate         = "2.5 Gb/sec (1X SDR)"
	vmRDMACMMinor  = 124
)

// vmMAC is QEMU's default MAC; a second NIC gets the next one.
func vmMAC(nic int) [6]byte { return [6]byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56 + byte(nic)} }

// eui64GUID is the GUID addrconf_addr_eui48 makes of a MAC (rxe, siw).
func eui64GUID(mac [6]byte) string {
	return fmt.Sprintf("%02x%02x:%02xff:fe%02x:%02x%02x", mac[0]^0x02, mac[1], mac[2], mac[3], mac[4], mac[5])
}

// rxeHCA is an rxe on netdev: a parent file naming it, node_desc "rxe", 1024
// GID slots of which rxe (RoCE v2 only) fills 0 with the link-local GID and
// 1 with the IPv4 address; the other slots read as zeros and their
// gid_attrs fail (EINVAL). Its uverbs and umad index is idx.
func rxeHCA(name, netdev string, mac [6]byte, ip []byte, idx int) HCASpec {
	ll := eui64GID(mac)
	gids := []GIDSpec{{0, ll, gidV2, netdev}}
	if ip != nil {
		gids = append(gids, GIDSpec{1, ipv4GID(ip[0], ip[1], ip[2], ip[3]), gidV2, netdev})
	}
	return HCASpec{
		Name: name, NodeType: "1: CA", NodeDesc: "rxe",
		NodeGUID: eui64GUID(mac), SysImageGUID: eui64GUID(mac),
		Ports: []PortSpec{{
			State: "4: ACTIVE", PhysState: "5: LinkUp", LinkLayer: eth, Rate: vmRate,
			GIDs: gids, GIDTableLen: rxeGIDTableLen, UMAD: idx,
		}},
		Uverbs:  idx,
		Netdevs: []string{netdev},
	}
}

// siwHCA is a siw on netdev: node_type "4: RNIC", node_desc "Software iWARP
// stack", one GID slot holding the MAC ("IB/RoCE v1", its ndevs entry fails
// with EINVAL), no parent file and no P_Key table: its netdev shows only in
// RDMA netlink. No MAD devices (iWARP has none).
func siwHCA(name string, mac [6]byte, uverbs int, netdev string) HCASpec {
	m := mac
	gid := fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:0000:0000:0000:0000:0000", m[0], m[1], m[2], m[3], m[4], m[5])
	return HCASpec{
		Name: name, NodeType: "4: RNIC", NodeDesc: "Software iWARP stack",
		NodeGUID: eui64GUID(m), SysImageGUID: eui64GUID(m),
		Ports: []PortSpec{{
			State: "4: ACTIVE", PhysState: "5: LinkUp", LinkLayer: eth, Rate: vmRate,
			GIDs: []GIDSpec{{Index: 0, GID: gid, Type: gidV1}}, GIDTableLen: 1, UMAD: -1,
		}},
		Uverbs:  uverbs,
		Netdevs: []string{netdev},
	}
}

// softRoCE is a VM "vm01" with rdma-core installed and Soft-RoCE rxe0 on the
// virtio netdev eth0 (MAC 52:54:00:12:34:56, 192.168.122.10), laid out as
// the rxe preset but with node_desc "vm01 rxe0" (rdma-ndd). rdma_cm is
// 10:122, netns shared.
func softRoCE() Spec {
	h := rxeHCA("rxe0", "eth0", vmMAC(0), []byte{192, 168, 122, 10}, 0)
	h.NodeDesc = ""
	return Spec{Hostname: "vm01", NetnsShared: true, RDMACMMinor: 122, HCAs: []HCASpec{h}}
}

// rxe is rxe0 of the test/vm guest (Debian's 6.1 kernel, "rdma link add rxe0
// type rxe netdev eth0" on QEMU's user network, 10.0.2.15): uverbs0,
// umad0/issm0, rdma_cm 10:124, netns shared.
func rxe() Spec {
	return Spec{Hostname: "vm", NetnsShared: true, RDMACMMinor: vmRDMACMMinor,
		HCAs: []HCASpec{rxeHCA("rxe0", "eth0", vmMAC(0), []byte{10, 0, 2, 15}, 0)}}
}

// siw is soft-iWARP alone in that guest ("rdma link add siw0 type siw
// netdev eth0"): siw0, uverbs0, rdma_cm 10:124, netns shared.
func siw() Spec {
	return Spec{Hostname: "vm", NetnsShared: true, RDMACMMinor: vmRDMACMMinor,
		HCAs: []HCASpec{siwHCA("siw0", vmMAC(0), 0, "eth0")}}
}

// vm is the whole test/vm guest: rxe0 on eth0 (10.0.2.15), rxe1 on eth1
// (52:54:00:12:34:57, 10.0.3.15) and siw0 on eth0; uverbs0..2 in that order,
// umad0/1 for the rxes, rdma_cm 10:124, netns shared.
func vm() Spec {
	return Spec{Hostname: "vm", NetnsShared: true, RDMACMMinor: vmRDMACMMinor, HCAs: []HCASpec{
		rxeHCA("rxe0", "eth0", vmMAC(0), []byte{10, 0, 2, 15}, 0),
		rxeHCA("rxe1", "eth1", vmMAC(1), []byte{10, 0, 3, 15}, 1),
		siwHCA("siw0", vmMAC(0), 2, "eth0"),
	}}
}

// empty is a node "empty01" with the RDMA core loaded and no device: the
// class dirs exist (class/net holds only lo), no rdma_cm.
func empty() Spec { return Spec{Hostname: "empty01", NetnsShared: true} }

// broken is a node "broken01" with six ConnectX-7 IB HCAs on pci0000:00
// (mlx5_I at pci0000:00/0000:00:0<I+1>.0/0000:0<I+1>:00.0, ibp<I+1>s0,
// NUMA 0, GUID a088:c203:00bb:00<I>0, umadI), each but mlx5_0 with one
// defect:
//
//	mlx5_0 good (uverbs0)
//	mlx5_1 ports/1/rate is "fast" (uverbs1)
//	mlx5_2 ports/1/state is "banana" (uverbs2)
//	mlx5_3 fw_ver is missing (uverbs3)
//	mlx5_4 no uverbs device
//	mlx5_5 PCI numa_node is "x" (uverbs4: the kernel hands out the lowest free index)
//
// rdma_cm is 10:58, netns shared.
func broken() Spec {
	s := Spec{Hostname: "broken01", NetnsShared: true, RDMACMMinor: 58}
	for i := 0; i < 6; i++ {
		path := pciPath("pci0000:00", fmt.Sprintf("0000:00:%02x.0", i+1), fmt.Sprintf("0000:%02x:00.0", i+1))
		h := cx7(fmt.Sprintf("mlx5_%d", i), fmt.Sprintf("a088:c203:00bb:00%d0", i), path, 0, i, uint16(0x30+i))
		s.HCAs = append(s.HCAs, h)
	}
	s.HCAs[1].Corrupt = map[string]string{"ports/1/rate": "fast"}
	s.HCAs[2].Corrupt = map[string]string{"ports/1/state": "banana"}
	s.HCAs[3].Corrupt = map[string]string{"fw_ver": ""}
	s.HCAs[4].Uverbs = -1
	s.HCAs[5].Uverbs = 4
	s.HCAs[5].Corrupt = map[string]string{"pci:numa_node": "x"}
	return s
}

// Synthetic is n single-port ConnectX-7 IB HCAs mlx5_0..n-1 for benchmarks:
// two per PCIe root (each behind its own bridge), eight roots per PCI
// domain, the first half of the roots on NUMA 0 and the rest on NUMA 1.
// Root r is pci<domain>:<bus> with domain r/8 and bus 0x20*(r%8); its HCAs
// sit on buses +1 and +2. uverbsI/umadI follow the kernel past the fixed
// minor ranges (dynamic majors from uverbs32 and umad64 on).
func Synthetic(n int) Spec {
	s := Spec{Hostname: "synth01", NetnsShared: true, RDMACMMinor: 58}
	roots := (n + 1) / 2
	for i := 0; i < n; i++ {
		r, j := i/2, i%2
		domain, bus := r/8, 0x20*(r%8)
		numa := 0
		if r >= (roots+1)/2 {
			numa = 1
		}
		path := pciPath(fmt.Sprintf("pci%04x:%02x", domain, bus),
			fmt.Sprintf("%04x:%02x:%02x.0", domain, bus, j+1),
			fmt.Sprintf("%04x:%02x:00.0", domain, bus+1+j))
		guid := fmt.Sprintf("a088:c203:%04x:%04x", 0x100+(i>>16), i&0xffff)
		s.HCAs = append(s.HCAs, cx7(fmt.Sprintf("mlx5_%d", i), guid, path, numa, i, uint16(0x10+i%0xbf00)))
	}
	return s
}
