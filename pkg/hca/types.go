// Package hca discovers RDMA host channel adapters from sysfs and /dev.
//
// It knows nothing of Kubernetes, CDI or gRPC: it turns a kernel's view of
// the RDMA subsystem into plain values. Discovery is on the slow path (start
// and rescans); nothing here is called while a claim is prepared.
package hca

// LinkLayer is a port's link layer as the kernel names it.
type LinkLayer string

const (
	LinkLayerInfiniBand LinkLayer = "InfiniBand"
	LinkLayerEthernet   LinkLayer = "Ethernet"
)

// Transport is the RDMA transport an HCA speaks, derived from its node type
// and link layer.
type Transport string

const (
	TransportIB    Transport = "ib"
	TransportRoCE  Transport = "roce"
	TransportIWARP Transport = "iwarp"
)

// NetnsMode is the RDMA subsystem's network namespace mode, as the
// inventory reports it (Unknown when neither sysfs nor netlink says).
// rdmanl.NetnsMode is the kernel's netlink attribute, mapped to this in
// netlink.go.
type NetnsMode string

const (
	NetnsShared    NetnsMode = "shared"
	NetnsExclusive NetnsMode = "exclusive"
	NetnsUnknown   NetnsMode = ""
)

// Source says where a node-wide fact came from.
type Source string

const (
	SourceNone    Source = ""
	SourceNetlink Source = "netlink" // RDMA netlink (rdma system, rdma link)
	SourceSysfs   Source = "sysfs"   // module/ib_core/parameters/netns_mode
)

// SRIOVRole tells whether an HCA is a physical or a virtual function.
type SRIOVRole string

const (
	SRIOVNone SRIOVRole = ""   // not SR-IOV capable, or software
	SRIOVPF   SRIOVRole = "PF" // physical function with VFs configured or capable
	SRIOVVF   SRIOVRole = "VF" // virtual function
)

// Inventory is one discovery pass over a node.
type Inventory struct {
	// HCAs sorted by Name.
	HCAs []HCA
	// NetnsMode of the RDMA subsystem (shared unless the admin changed it).
	NetnsMode NetnsMode
	// NetnsModeSource is where NetnsMode came from: RDMA netlink when
	// discovery was given it and the kernel answered, else sysfs.
	NetnsModeSource Source
	// RDMACM is /dev/infiniband/rdma_cm, shared by every HCA; nil when the
	// rdma_ucm module is not loaded.
	RDMACM *CharDevice
	// Hidden are ibdevs that class/infiniband_verbs names but
	// class/infiniband does not list, sorted: in exclusive netns mode, the
	// devices of other network namespaces than the reader's.
	Hidden []string
	// Warnings about node-wide files (netns mode, rdma_cm); per-HCA ones are
	// on the HCA.
	Warnings []string
}

// HCA is one RDMA device (one ibdev).
type HCA struct {
	// Name is the ibdev name, e.g. mlx5_0.
	Name string

	Identity

	Ports []Port // sorted by Number

	// Uverbs is the verbs device; nil when none is bound.
	Uverbs *CharDevice
	// MAD devices (umadN, issmN) of every port, sorted by name.
	MAD []CharDevice

	// PCI is nil for software devices.
	PCI *PCIInfo
	// DataPath is where GPU peer-to-peer DMA enters the HCA, what shares
	// that path and whether it is ready; nil for software devices and when
	// the PCI tree could not be read (a warning says why).
	DataPath *DataPath

	// Netdevs of the HCA: device/net/*, the ports' GID netdevs and (with
	// RDMA netlink) the ports' netdevs, sorted, deduplicated.
	Netdevs []string

	// Software is true for Soft-RoCE (rxe) and soft-iWARP (siw).
	Software bool
	// ParentNetdev of a software device: the ndev of its GIDs, else its
	// parent file (rxe), else its port's netdev in RDMA netlink (siw has no
	// sysfs trace of it).
	ParentNetdev string

	// Usable is false when the HCA cannot be handed to a container;
	// UnusableReason says why.
	Usable         bool
	UnusableReason string

	// Warnings name the files that were missing or garbled.
	Warnings []string
}

// Identity is what the device's own files say it is (class/infiniband/<dev>).
type Identity struct {
	NodeType     string // "CA", "RNIC", ... (the word after "1: ")
	NodeGUID     string // a088:c203:0012:3a40
	SysImageGUID string
	FirmwareVer  string // as the kernel prints it, e.g. 28.39.2048
	HCAType      string // MT4129
	BoardID      string
	NodeDesc     string

	// Model is a marketing name from the PCI ID table, else HCAType.
	Model string
}

// Port is one port of an HCA.
type Port struct {
	Number    int
	State     string // ACTIVE, DOWN, INIT, ARMED, ...
	PhysState string // LinkUp, Polling, Disabled, ...
	LinkLayer LinkLayer
	// RateGbps is the port speed in Gb/s, e.g. 400 (2.5 for SDR 1X).
	RateGbps float64
	Width    string // 4X
	Speed    string // NDR, HDR, ...
	LID      int    // IB only; 0 when unassigned
	SMLID    int
	// Netdev is the port's netdev as RDMA netlink reports it (rdma link);
	// "" without netlink, or when the netdev is in another namespace.
	Netdev string
	GIDs   []GID // non-empty GID slots, sorted by Index
	// RoCEv2GIDIndex is the lowest index of a RoCE v2 GID that carries an IP
	// address (IPv4-mapped first, then IPv6), or -1.
	RoCEv2GIDIndex int
}

// Active reports whether the port can carry traffic.
func (p Port) Active() bool { return p.State == "ACTIVE" }

// GID is one GID table entry.
type GID struct {
	Index  int
	GID    string // fe80:0000:0000:0000:a088:c203:0012:3a40
	Type   string // "IB/RoCE v1" or "RoCE v2"; empty when unreadable
	Netdev string // empty on InfiniBand ports
}

// CharDevice is a character device node of the RDMA subsystem.
type CharDevice struct {
	Name  string // uverbs0, umad1, issm1, rdma_cm
	Path  string // /dev/infiniband/uverbs0 (container path, also the host path under /dev)
	Major uint32
	Minor uint32
	Port  int // MAD devices only
	// Exists is whether the node was found under the dev root.
	Exists bool
}

// PCIInfo is the PCI side of a hardware HCA.
type PCIInfo struct {
	BusID           string // 0000:16:00.0
	VendorID        string // 15b3 (no 0x)
	DeviceID        string // 1021
	SubsystemVendor string
	SubsystemDevice string
	Driver          string // mlx5_core
	NUMANode        int    // -1 when unknown
	PCIeRoot        string // pci0000:15
	SRIOV           SRIOVRole
	NumVFs          int    // PF only
	PFBusID         string // VF only
}

// Transport of the HCA: iWARP for RNICs, RoCE when its first port is
// Ethernet, InfiniBand otherwise.
func (h HCA) Transport() Transport {
	if h.NodeType == "RNIC" {
		return TransportIWARP
	}
	if len(h.Ports) > 0 && h.Ports[0].LinkLayer == LinkLayerEthernet {
		return TransportRoCE
	}
	return TransportIB
}

// AnyPortActive reports whether at least one port is ACTIVE.
func (h HCA) AnyPortActive() bool {
	for _, p := range h.Ports {
		if p.Active() {
			return true
		}
	}
	return false
}
