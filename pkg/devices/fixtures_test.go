package devices

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// Hand-built HCAs as discovery reports them on real machines.

// cx7 is a ConnectX-7 InfiniBand PF of a DGX H100.
func cx7() hca.HCA {
	return hca.HCA{Identity: hca.Identity{NodeType: "CA", NodeGUID: "a088:c203:0012:3a40", SysImageGUID: "a088:c203:0012:3a40", FirmwareVer: "28.39.2048", HCAType: "MT4129", BoardID: "MT_0000000838", NodeDesc: "dgx01 mlx5_0", Model: "ConnectX-7"},
		Name: "mlx5_0",

		Ports: []hca.Port{{
			Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: hca.LinkLayerInfiniBand,
			RateGbps: 400, Width: "4X", Speed: "NDR", LID: 0x1a, SMLID: 1, RoCEv2GIDIndex: -1,
			GIDs: []hca.GID{{Index: 0, GID: "fe80:0000:0000:0000:a088:c203:0012:3a40", Type: "IB/RoCE v1"}},
		}},
		Uverbs: &hca.CharDevice{Name: "uverbs0", Path: "/dev/infiniband/uverbs0", Major: 231, Minor: 192, Exists: true},
		MAD: []hca.CharDevice{
			{Name: "issm0", Path: "/dev/infiniband/issm0", Major: 231, Minor: 64, Port: 1, Exists: true},
			{Name: "umad0", Path: "/dev/infiniband/umad0", Major: 231, Minor: 0, Port: 1, Exists: true},
		},
		PCI: &hca.PCIInfo{
			BusID: "0000:16:00.0", VendorID: "15b3", DeviceID: "1021", SubsystemVendor: "15b3", SubsystemDevice: "0041",
			Driver: "mlx5_core", NUMANode: 0, PCIeRoot: "pci0000:15", SRIOV: hca.SRIOVPF, NumVFs: 8,
		},
		Netdevs: []string{"ibp22s0"},
		Usable:  true,
	}
}

// bf3 is a BlueField-3 RoCE port whose first RoCE v2 GID with an IP is 3.
func bf3() hca.HCA {
	return hca.HCA{Identity: hca.Identity{NodeType: "CA", NodeGUID: "5c25:7303:00a1:b2c4", SysImageGUID: "5c25:7303:00a1:b2c4", FirmwareVer: "32.41.1000", HCAType: "MT41692", Model: "BlueField-3"},
		Name: "mlx5_2",

		Ports: []hca.Port{{
			Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: hca.LinkLayerEthernet,
			RateGbps: 200, Width: "4X", Speed: "HDR", RoCEv2GIDIndex: 3,
		}},
		Uverbs: &hca.CharDevice{Name: "uverbs2", Path: "/dev/infiniband/uverbs2", Major: 231, Minor: 194, Exists: true},
		PCI: &hca.PCIInfo{
			BusID: "0000:a1:00.0", VendorID: "15b3", DeviceID: "a2dc", Driver: "mlx5_core",
			NUMANode: 1, PCIeRoot: "pci0000:a0", SRIOV: hca.SRIOVPF,
		},
		Netdevs: []string{"p0", "pf0hpf"},
		Usable:  true,
	}
}

// vf is a ConnectX-7 RoCE virtual function without an IP address yet.
func vf() hca.HCA {
	return hca.HCA{Identity: hca.Identity{NodeType: "CA", NodeGUID: "0000:0000:0000:0000", SysImageGUID: "a088:c203:0012:3a40", FirmwareVer: "28.39.2048", HCAType: "MT4126", Model: "ConnectX VF"},
		Name: "mlx5_4",

		Ports: []hca.Port{{
			Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: hca.LinkLayerEthernet,
			RateGbps: 400, RoCEv2GIDIndex: -1,
		}},
		Uverbs: &hca.CharDevice{Name: "uverbs4", Path: "/dev/infiniband/uverbs4", Major: 231, Minor: 196, Exists: true},
		PCI: &hca.PCIInfo{
			BusID: "0000:16:00.2", VendorID: "15b3", DeviceID: "101e", Driver: "mlx5_core",
			NUMANode: 0, PCIeRoot: "pci0000:15", SRIOV: hca.SRIOVVF, PFBusID: "0000:16:00.0",
		},
		Netdevs: []string{"ens1f0v0"},
		Usable:  true,
	}
}

// rxe is Soft-RoCE on a VM's eth0: no PCI, no fw_ver, no hca_type.
func rxe() hca.HCA {
	return hca.HCA{Identity: hca.Identity{NodeType: "CA", NodeGUID: "5054:00ff:fe12:3456", SysImageGUID: "0000:0000:0000:0000", Model: "Soft-RoCE"},
		Name: "rxe0",

		Ports: []hca.Port{{
			Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: hca.LinkLayerEthernet,
			RateGbps: 2.5, Width: "1X", Speed: "SDR", RoCEv2GIDIndex: 1,
		}},
		Uverbs:       &hca.CharDevice{Name: "uverbs0", Path: "/dev/infiniband/uverbs0", Major: 231, Minor: 192, Exists: true},
		Netdevs:      []string{"eth0"},
		Software:     true,
		ParentNetdev: "eth0",
		Usable:       true,
	}
}

// noNUMA is a two-port ConnectX-6 in a VM: numa_node -1, port 1 polling,
// a zero-padded fw_ver, no netdev.
func noNUMA() hca.HCA {
	return hca.HCA{Identity: hca.Identity{NodeType: "CA", NodeGUID: "0c42:a103:0065:e2f0", SysImageGUID: "0c42:a103:0065:e2f0", FirmwareVer: "20.035.1012", HCAType: "MT4123", Model: "ConnectX-6"},
		Name: "mlx5_1",

		Ports: []hca.Port{
			{Number: 1, State: "DOWN", PhysState: "Polling", LinkLayer: hca.LinkLayerInfiniBand, RateGbps: 10, RoCEv2GIDIndex: -1},
			{Number: 2, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: hca.LinkLayerInfiniBand, RateGbps: 200, LID: 7, RoCEv2GIDIndex: -1},
		},
		Uverbs: &hca.CharDevice{Name: "uverbs1", Path: "/dev/infiniband/uverbs1", Major: 231, Minor: 193, Exists: true},
		PCI: &hca.PCIInfo{
			BusID: "0000:00:05.0", VendorID: "15b3", DeviceID: "101b", Driver: "mlx5_core",
			NUMANode: -1, PCIeRoot: "pci0000:00",
		},
		Usable: true,
	}
}

// irdma is an Intel E810 iWARP RNIC with a two-component fw_ver and no
// hca_type.
func irdma() hca.HCA {
	return hca.HCA{Identity: hca.Identity{NodeType: "RNIC", NodeGUID: "b496:91ff:fea1:0000", SysImageGUID: "b496:91ff:fea1:0000", FirmwareVer: "1.70", Model: "E810-C"},
		Name: "irdma0",

		Ports: []hca.Port{{
			Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: hca.LinkLayerEthernet,
			RateGbps: 100, RoCEv2GIDIndex: 0,
		}},
		Uverbs: &hca.CharDevice{Name: "uverbs5", Path: "/dev/infiniband/uverbs5", Major: 231, Minor: 197, Exists: true},
		PCI: &hca.PCIInfo{
			BusID: "0000:31:00.0", VendorID: "8086", DeviceID: "1592", Driver: "ice",
			NUMANode: 0, PCIeRoot: "pci0000:30",
		},
		Netdevs: []string{"ens2f0"},
		Usable:  true,
	}
}

// unusable has no verbs device bound.
func unusable() hca.HCA {
	h := cx7()
	h.Name, h.Uverbs, h.MAD = "mlx5_3", nil, nil
	h.PCI.BusID = "0000:17:00.0"
	h.Usable, h.UnusableReason = false, "no uverbs device"
	return h
}

// node is every fixture on one node, in discovery's (ibdev) order.
func node() hca.Inventory {
	return hca.Inventory{
		HCAs:      []hca.HCA{irdma(), cx7(), noNUMA(), bf3(), unusable(), vf(), rxe()},
		NetnsMode: hca.NetnsShared,
		RDMACM:    &hca.CharDevice{Name: "rdma_cm", Path: "/dev/infiniband/rdma_cm", Major: 10, Minor: 58, Exists: true},
	}
}

// synthetic is the i-th of many identical ConnectX-7s, with distinct
// names, PCI addresses and GUIDs.
func synthetic(i int) hca.HCA {
	h := cx7()
	h.Name = fmt.Sprintf("mlx5_%d", i)
	h.NodeGUID = fmt.Sprintf("a088:c203:%04x:%04x", i>>16, i&0xffff)
	h.PCI.BusID = fmt.Sprintf("0000:%02x:%02x.%d", i>>5&0xff, i&0x1f, 0)
	h.PCI.NUMANode = i % 2
	h.Netdevs = []string{fmt.Sprintf("ibp%ds0", i)}
	return h
}

func syntheticInventory(n int) hca.Inventory {
	inv := hca.Inventory{NetnsMode: hca.NetnsExclusive}
	for i := range n {
		inv.HCAs = append(inv.HCAs, synthetic(i))
	}
	return inv
}

// Expected attribute values, spelled out so that the tests pin the contract
// rather than the constants.

type attrs = map[resourceapi.QualifiedName]resourceapi.DeviceAttribute

func str(v string) resourceapi.DeviceAttribute  { return resourceapi.DeviceAttribute{StringValue: &v} }
func num(v int64) resourceapi.DeviceAttribute   { return resourceapi.DeviceAttribute{IntValue: &v} }
func flag(v bool) resourceapi.DeviceAttribute   { return resourceapi.DeviceAttribute{BoolValue: &v} }
func semv(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: &v} }

// d is an attribute in the default driver's domain.
func d(id string) resourceapi.QualifiedName { return resourceapi.QualifiedName("rdma.dra.dev/" + id) }

const (
	pciBusID resourceapi.QualifiedName = "resource.kubernetes.io/pciBusID"
	pcieRoot resourceapi.QualifiedName = "resource.kubernetes.io/pcieRoot"
	numaNode resourceapi.QualifiedName = "resource.kubernetes.io/numaNode"
)
