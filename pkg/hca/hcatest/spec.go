package hcatest

// Spec describes a simulated node.
type Spec struct {
	Hostname    string // node_desc is "<Hostname> <ibdev>"
	NetnsShared bool   // module/ib_core/parameters/netns_mode: "Y" when true, "N" when false
	RDMACMMinor uint32 // misc minor of rdma_cm (e.g. 58); 0 means "no rdma_cm" (module not loaded)
	HCAs        []HCASpec
	// Devices are the PCI functions that are not HCAs: switch ports, root
	// ports with their ACS, GPUs, Data Direct DMA functions. A bridge on an
	// HCA's or device's path that is not listed here is an Intel root port
	// without ACS.
	Devices []PCIDevSpec
	// ForeignNetns writes sysfs as a process outside the initial network
	// namespace sees it. In exclusive mode (NetnsShared false) the RDMA
	// devices are not its own: class/infiniband is empty and the ibdev
	// directories are gone, while class/infiniband_verbs and
	// /dev/infiniband still list every device. In shared mode it changes
	// nothing in sysfs (Netlink then reports no port netdevs).
	ForeignNetns bool
}

// HCASpec describes one RDMA device (one ibdev).
type HCASpec struct {
	Name         string     // ibdev, e.g. mlx5_0
	NodeType     string     // "1: CA" when empty; "4: RNIC" for iWARP
	NodeDesc     string     // node_desc; empty => "<Hostname> <ibdev>" (what rdma-ndd writes)
	NodeGUID     string     // a088:c203:0012:3a40
	SysImageGUID string     // shared by the functions of one card
	FWVer        string     // always written (ib_core attribute); empty for drivers without a firmware string
	HCAType      string     // driver attribute: not written when empty (rxe has none)
	BoardID      string     // driver attribute: not written when empty
	Ports        []PortSpec // port N is Ports[N-1]
	PCI          *PCISpec   // nil => software device under devices/virtual
	Uverbs       int        // uverbs index N (dev 231:192+N); -1 => no uverbs device bound
	// Netdevs under <pci>/net/ (hardware); for a software device, its parent
	// netdev, created under devices/virtual/net/ unless a hardware HCA owns it.
	// A software CA (rxe) names it in a parent file; an RNIC (siw) has no
	// sysfs trace of it: only RDMA netlink (Node.Netlink) reports it.
	Netdevs []string
	// Corrupt overwrites files after the tree is written, to feed discovery
	// bad input. Keys are paths relative to the ibdev dir ("ports/1/rate"),
	// or "pci:<path>" relative to the PCI function dir. The value is written
	// followed by "\n"; an empty value removes the file (or link, or dir).
	Corrupt map[string]string
}

// PortSpec describes one port. Empty State, PhysState, LinkLayer and Rate
// default to an active 400G InfiniBand port, so small test specs stay small.
type PortSpec struct {
	State       string    // "4: ACTIVE" etc (full kernel text)
	PhysState   string    // "5: LinkUp"
	LinkLayer   string    // "InfiniBand" | "Ethernet"
	Rate        string    // "400 Gb/sec (4X NDR)"
	LID, SMLID  uint16    // written as hex "0x1a"
	GIDs        []GIDSpec // occupied slots; all other slots up to GIDTableLen are all-zero
	GIDTableLen int       // default 16
	// PKeys is the P_Key table from index 0 ("0xffff", "0x8001"); default
	// "0xffff" alone. An InfiniBand port's table is 128 entries long, the
	// rest 0x0000, as mlx5 has it; other ports have just their entries.
	PKeys []string
	UMAD  int // umad index (dev 231:N, issm 231:64+N); -1 => none
}

// GIDSpec is one occupied GID table slot.
type GIDSpec struct {
	Index  int
	GID    string // written as given: fe80:0000:0000:0000:a088:c203:0012:3a40
	Type   string // "IB/RoCE v1" (default) | "RoCE v2"
	Netdev string // Ethernet only; on InfiniBand ports ndevs/<i> is a fault
}

// PCISpec is the PCI function of a hardware HCA.
type PCISpec struct {
	BusID string // 0000:16:00.0
	// Path holds the elements under devices/, ending in BusID, e.g.
	// {"pci0000:15", "0000:15:01.0", "0000:16:00.0"}; those between the
	// root complex and the function are bridges.
	Path []string

	// IDs without 0x; written with the 0x prefix, not written when empty.
	Vendor, Device, SubsystemVendor, SubsystemDevice string

	Driver   string   // mlx5_core; empty => no driver link
	NUMANode int      // written as-is, -1 allowed
	TotalVFs int      // >0 => PF: writes sriov_totalvfs
	VFs      []string // PF: bus IDs of its VFs => sriov_numvfs=len, virtfnN links
	PF       string   // VF: bus ID of its PF => physfn link

	VPD        *VPDSpec // the card's Vital Product Data (vpd file, binary); nil: none
	ATS        bool     // an ATS extended capability in config
	IOMMUGroup string   // iommu_group link to kernel/iommu_groups/<it>; "" none
}

// PCIDevSpec is a PCI function other than an HCA.
type PCIDevSpec struct {
	// Path as in PCISpec: the root complex, the bridges, then this
	// function's bus ID.
	Path []string
	// IDs without 0x; Class is six hex digits ("060400" a bridge, "030200"
	// a 3D controller).
	Vendor, Device, SubsystemVendor, SubsystemDevice, Class string
	Driver                                                  string
	NUMANode                                                int
	// ACS, when set, is the ACS Control Register of an ACS extended
	// capability (SV 0x1, RR 0x4, CR 0x8, UF 0x10, DT 0x40); nil: no ACS.
	ACS        *uint16
	VPD        *VPDSpec
	IOMMUGroup string
}

// BusID is the function's bus ID, the last element of Path.
func (d PCIDevSpec) BusID() string { return d.Path[len(d.Path)-1] }

// VPDSpec is the content of a vpd file: an identifier string and the VPD-R
// keywords PN, EC, SN and V3, closed by a valid RV checksum.
type VPDSpec struct {
	Name, PartNumber, EC, Serial, V3 string
}

const defaultGIDTableLen = 16

// withDefaults fills the documented defaults in, so Node.Spec says what is
// on disk.
func withDefaults(s Spec) Spec {
	for i := range s.HCAs {
		h := &s.HCAs[i]
		if h.NodeType == "" {
			h.NodeType = "1: CA"
		}
		for j := range h.Ports {
			p := &h.Ports[j]
			p.State = cmpOr(p.State, "4: ACTIVE")
			p.PhysState = cmpOr(p.PhysState, "5: LinkUp")
			p.LinkLayer = cmpOr(p.LinkLayer, "InfiniBand")
			p.Rate = cmpOr(p.Rate, "400 Gb/sec (4X NDR)")
			if p.GIDTableLen == 0 {
				p.GIDTableLen = defaultGIDTableLen
			}
			for k := range p.GIDs {
				p.GIDs[k].Type = cmpOr(p.GIDs[k].Type, "IB/RoCE v1")
			}
		}
	}
	return s
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func cloneSpec(s Spec) Spec {
	hcas := make([]HCASpec, len(s.HCAs))
	for i, h := range s.HCAs {
		h.Ports = append([]PortSpec(nil), h.Ports...)
		for j := range h.Ports {
			h.Ports[j].GIDs = append([]GIDSpec(nil), h.Ports[j].GIDs...)
		}
		h.Netdevs = append([]string(nil), h.Netdevs...)
		if h.Corrupt != nil {
			c := make(map[string]string, len(h.Corrupt))
			for k, v := range h.Corrupt {
				c[k] = v
			}
			h.Corrupt = c
		}
		if h.PCI != nil {
			p := *h.PCI
			p.Path = append([]string(nil), p.Path...)
			p.VFs = append([]string(nil), p.VFs...)
			p.VPD = clonePtr(p.VPD)
			h.PCI = &p
		}
		hcas[i] = h
	}
	s.HCAs = hcas
	devs := make([]PCIDevSpec, len(s.Devices))
	for i, d := range s.Devices {
		d.Path = append([]string(nil), d.Path...)
		d.ACS, d.VPD = clonePtr(d.ACS), clonePtr(d.VPD)
		devs[i] = d
	}
	s.Devices = devs
	return s
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
