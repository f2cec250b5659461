package checkpoint

import (
	"encoding/json"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// HCA is the checkpoint's copy of an HCA moved into a pod's network
// namespace (Device.MovedHCA): what a restarted daemon publishes and writes
// specs from while the host's sysfs does not list it.
//
// It is a type of its own so that hca.HCA may change without changing the
// format. Its JSON names equal hca.HCA's Go field names but for case: the
// release 0.1.0 decoded this record into hca.HCA, untagged, and
// encoding/json matches names case-insensitively, so 0.1.0 reads what this
// writes (a rollback keeps its moved HCAs). A field added here must keep
// that rule, or be one whose absence is safe in 0.1.0.
type HCA struct {
	Name string `json:"name"`
	// HCAIdentity is embedded untagged: its fields are this record's own
	// in JSON, as before it was split out.
	HCAIdentity
	Ports          []HCAPort    `json:"ports,omitempty"`
	Uverbs         *CharDevice  `json:"uverbs,omitempty"`
	MAD            []CharDevice `json:"mad,omitempty"`
	PCI            *PCIInfo     `json:"pci,omitempty"`
	DataPath       *DataPath    `json:"dataPath,omitempty"`
	Netdevs        []string     `json:"netdevs,omitempty"`
	Software       bool         `json:"software,omitempty"`
	ParentNetdev   string       `json:"parentNetdev,omitempty"`
	Usable         bool         `json:"usable,omitempty"`
	UnusableReason string       `json:"unusableReason,omitempty"`
	Warnings       []string     `json:"warnings,omitempty"`
}

// HCAIdentity is hca.Identity in the checkpoint.
type HCAIdentity struct {
	NodeType     string `json:"nodeType,omitempty"`
	NodeGUID     string `json:"nodeGUID,omitempty"`
	SysImageGUID string `json:"sysImageGUID,omitempty"`
	FirmwareVer  string `json:"firmwareVer,omitempty"`
	HCAType      string `json:"hcaType,omitempty"`
	BoardID      string `json:"boardID,omitempty"`
	NodeDesc     string `json:"nodeDesc,omitempty"`
	Model        string `json:"model,omitempty"`
}

// HCAPort is one port of a moved HCA.
type HCAPort struct {
	Number    int     `json:"number"`
	State     string  `json:"state,omitempty"`
	PhysState string  `json:"physState,omitempty"`
	LinkLayer string  `json:"linkLayer,omitempty"`
	RateGbps  float64 `json:"rateGbps,omitempty"`
	Width     string  `json:"width,omitempty"`
	Speed     string  `json:"speed,omitempty"`
	LID       int     `json:"lid,omitempty"`
	SMLID     int     `json:"smLID,omitempty"`
	Netdev    string  `json:"netdev,omitempty"`
	GIDs      []GID   `json:"gids,omitempty"`
	// Always written: -1 means none, and 0 is an index.
	RoCEv2GIDIndex int `json:"roceV2GIDIndex"`
}

// GID is one GID table entry of a moved HCA's port.
type GID struct {
	Index  int    `json:"index"`
	GID    string `json:"gid"`
	Type   string `json:"type,omitempty"`
	Netdev string `json:"netdev,omitempty"`
}

// CharDevice is a device node of a moved HCA.
type CharDevice struct {
	Name   string `json:"name"`
	Path   string `json:"path"`
	Major  uint32 `json:"major"`
	Minor  uint32 `json:"minor"`
	Port   int    `json:"port,omitempty"`
	Exists bool   `json:"exists,omitempty"`
}

// PCIInfo is the PCI side of a moved hardware HCA.
type PCIInfo struct {
	BusID           string `json:"busID"`
	VendorID        string `json:"vendorID,omitempty"`
	DeviceID        string `json:"deviceID,omitempty"`
	SubsystemVendor string `json:"subsystemVendor,omitempty"`
	SubsystemDevice string `json:"subsystemDevice,omitempty"`
	Driver          string `json:"driver,omitempty"`
	// Always written: -1 means unknown, and 0 is a node.
	NUMANode int    `json:"numaNode"`
	PCIeRoot string `json:"pcieRoot,omitempty"`
	SRIOV    string `json:"sriov,omitempty"`
	NumVFs   int    `json:"numVFs,omitempty"`
	PFBusID  string `json:"pfBusID,omitempty"`
}

// DataPath is the GPU data path of a moved HCA (hca.DataPath): a restarted
// daemon publishes its pcieRoot and GPUDirect taint from it.
type DataPath struct {
	Function        string    `json:"function"`
	DataDirect      bool      `json:"dataDirect,omitempty"`
	PCIeRoot        string    `json:"pcieRoot,omitempty"`
	GPUs            []string  `json:"gpus,omitempty"`
	GPULink         string    `json:"gpuLink,omitempty"`
	Shared          string    `json:"shared,omitempty"`
	Board           string    `json:"board,omitempty"`
	Product         string    `json:"product,omitempty"`
	ACS             []ACSPort `json:"acs,omitempty"`
	GPUDirect       string    `json:"gpuDirect,omitempty"`
	GPUDirectCause  string    `json:"gpuDirectCause,omitempty"`
	GPUDirectReason string    `json:"gpuDirectReason,omitempty"`
}

// ACSPort is a switch port on a moved HCA's data path.
type ACSPort struct {
	BusID   string `json:"busID"`
	Toward  string `json:"toward,omitempty"`
	HasACS  bool   `json:"hasACS,omitempty"`
	Control uint16 `json:"control,omitempty"`
}

// UnmarshalJSON reads both shapes of the record: this type's, and the
// untagged JSON of hca.HCA that release 0.1.0 wrote (Go field names; see
// hcaV1Untagged). The shape is told by the name key's spelling.
func (h *HCA) UnmarshalJSON(b []byte) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return err
	}
	if _, untagged := keys["Name"]; untagged {
		var old hcaV1Untagged
		if err := json.Unmarshal(b, &old); err != nil {
			return err
		}
		*h = old.convert()
		return nil
	}
	type plain HCA // without this method
	return json.Unmarshal(b, (*plain)(h))
}

// SnapshotHCA is the record of h the checkpoint keeps while h is moved.
func SnapshotHCA(h hca.HCA) *HCA {
	out := &HCA{
		Name: h.Name, HCAIdentity: HCAIdentity(h.Identity),
		Netdevs: cloneStrings(h.Netdevs), Software: h.Software, ParentNetdev: h.ParentNetdev,
		Usable: h.Usable, UnusableReason: h.UnusableReason, Warnings: cloneStrings(h.Warnings),
	}
	for _, p := range h.Ports {
		port := HCAPort{
			Number: p.Number, State: p.State, PhysState: p.PhysState, LinkLayer: string(p.LinkLayer),
			RateGbps: p.RateGbps, Width: p.Width, Speed: p.Speed, LID: p.LID, SMLID: p.SMLID,
			Netdev: p.Netdev, RoCEv2GIDIndex: p.RoCEv2GIDIndex,
		}
		for _, g := range p.GIDs {
			port.GIDs = append(port.GIDs, GID{Index: g.Index, GID: g.GID, Type: g.Type, Netdev: g.Netdev})
		}
		out.Ports = append(out.Ports, port)
	}
	if h.Uverbs != nil {
		c := charDevice(*h.Uverbs)
		out.Uverbs = &c
	}
	for _, m := range h.MAD {
		out.MAD = append(out.MAD, charDevice(m))
	}
	if p := h.PCI; p != nil {
		out.PCI = &PCIInfo{
			BusID: p.BusID, VendorID: p.VendorID, DeviceID: p.DeviceID, SubsystemVendor: p.SubsystemVendor,
			SubsystemDevice: p.SubsystemDevice, Driver: p.Driver, NUMANode: p.NUMANode, PCIeRoot: p.PCIeRoot,
			SRIOV: string(p.SRIOV), NumVFs: p.NumVFs, PFBusID: p.PFBusID,
		}
	}
	if d := h.DataPath; d != nil {
		out.DataPath = &DataPath{Function: d.Function, DataDirect: d.DataDirect, PCIeRoot: d.PCIeRoot,
			GPUs: cloneStrings(d.GPUs), GPULink: string(d.GPULink), Shared: d.Shared, Board: d.Board, Product: d.Product,
			GPUDirect: string(d.GPUDirect), GPUDirectCause: d.GPUDirectCause, GPUDirectReason: d.GPUDirectReason}
		for _, a := range d.ACS {
			out.DataPath.ACS = append(out.DataPath.ACS, ACSPort{BusID: a.BusID, Toward: a.Toward, HasACS: a.HasACS, Control: a.Control})
		}
	}
	return out
}

func charDevice(c hca.CharDevice) CharDevice {
	return CharDevice{Name: c.Name, Path: c.Path, Major: c.Major, Minor: c.Minor, Port: c.Port, Exists: c.Exists}
}

// HCA is the recorded HCA as discovery would report it.
func (s *HCA) HCA() hca.HCA {
	h := hca.HCA{
		Name: s.Name, Identity: hca.Identity(s.HCAIdentity),
		Netdevs: cloneStrings(s.Netdevs), Software: s.Software, ParentNetdev: s.ParentNetdev,
		Usable: s.Usable, UnusableReason: s.UnusableReason, Warnings: cloneStrings(s.Warnings),
	}
	for _, p := range s.Ports {
		port := hca.Port{
			Number: p.Number, State: p.State, PhysState: p.PhysState, LinkLayer: hca.LinkLayer(p.LinkLayer),
			RateGbps: p.RateGbps, Width: p.Width, Speed: p.Speed, LID: p.LID, SMLID: p.SMLID,
			Netdev: p.Netdev, RoCEv2GIDIndex: p.RoCEv2GIDIndex,
		}
		for _, g := range p.GIDs {
			port.GIDs = append(port.GIDs, hca.GID{Index: g.Index, GID: g.GID, Type: g.Type, Netdev: g.Netdev})
		}
		h.Ports = append(h.Ports, port)
	}
	if s.Uverbs != nil {
		c := s.Uverbs.hca()
		h.Uverbs = &c
	}
	for _, m := range s.MAD {
		h.MAD = append(h.MAD, m.hca())
	}
	if p := s.PCI; p != nil {
		h.PCI = &hca.PCIInfo{
			BusID: p.BusID, VendorID: p.VendorID, DeviceID: p.DeviceID, SubsystemVendor: p.SubsystemVendor,
			SubsystemDevice: p.SubsystemDevice, Driver: p.Driver, NUMANode: p.NUMANode, PCIeRoot: p.PCIeRoot,
			SRIOV: hca.SRIOVRole(p.SRIOV), NumVFs: p.NumVFs, PFBusID: p.PFBusID,
		}
	}
	if d := s.DataPath; d != nil {
		h.DataPath = &hca.DataPath{Function: d.Function, DataDirect: d.DataDirect, PCIeRoot: d.PCIeRoot,
			GPUs: cloneStrings(d.GPUs), GPULink: hca.GPULink(d.GPULink), Shared: d.Shared, Board: d.Board, Product: d.Product,
			GPUDirect: hca.GPUDirect(d.GPUDirect), GPUDirectCause: d.GPUDirectCause, GPUDirectReason: d.GPUDirectReason}
		for _, a := range d.ACS {
			h.DataPath.ACS = append(h.DataPath.ACS, hca.ACSPort{BusID: a.BusID, Toward: a.Toward, HasACS: a.HasACS, Control: a.Control})
		}
	}
	return h
}

func (c CharDevice) hca() hca.CharDevice {
	return hca.CharDevice{Name: c.Name, Path: c.Path, Major: c.Major, Minor: c.Minor, Port: c.Port, Exists: c.Exists}
}

// clone is a deep copy.
func (s *HCA) clone() *HCA {
	if s == nil {
		return nil
	}
	return SnapshotHCA(s.HCA())
}

func cloneStrings(s []string) []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s...)
}

// hcaV1Untagged and the types below freeze hca.HCA as release 0.1.0 wrote
// it into checkpoints (json.Marshal of the untagged struct, Go field
// names). They never change: a change to hca.HCA must not break reading
// what 0.1.0 left on a node.
type hcaV1Untagged struct {
	Name string
	identityV1Untagged
	Ports          []portV1Untagged
	Uverbs         *charDeviceV1Untagged
	MAD            []charDeviceV1Untagged
	PCI            *pciV1Untagged
	Netdevs        []string
	Software       bool
	ParentNetdev   string
	Usable         bool
	UnusableReason string
	Warnings       []string
}

// identityV1Untagged is embedded: its fields are hcaV1Untagged's own in JSON.
type identityV1Untagged struct {
	NodeType     string
	NodeGUID     string
	SysImageGUID string
	FirmwareVer  string
	HCAType      string
	BoardID      string
	NodeDesc     string
	Model        string
}

type portV1Untagged struct {
	Number         int
	State          string
	PhysState      string
	LinkLayer      string
	RateGbps       float64
	Width          string
	Speed          string
	LID            int
	SMLID          int
	Netdev         string
	GIDs           []gidV1Untagged
	RoCEv2GIDIndex int
}

type gidV1Untagged struct {
	Index  int
	GID    string
	Type   string
	Netdev string
}

type charDeviceV1Untagged struct {
	Name   string
	Path   string
	Major  uint32
	Minor  uint32
	Port   int
	Exists bool
}

type pciV1Untagged struct {
	BusID           string
	VendorID        string
	DeviceID        string
	SubsystemVendor string
	SubsystemDevice string
	Driver          string
	NUMANode        int
	PCIeRoot        string
	SRIOV           string
	NumVFs          int
	PFBusID         string
}

func (o hcaV1Untagged) convert() HCA {
	h := HCA{
		Name: o.Name, HCAIdentity: HCAIdentity(o.identityV1Untagged),
		Netdevs: o.Netdevs, Software: o.Software, ParentNetdev: o.ParentNetdev,
		Usable: o.Usable, UnusableReason: o.UnusableReason, Warnings: o.Warnings,
	}
	for _, p := range o.Ports {
		port := HCAPort{
			Number: p.Number, State: p.State, PhysState: p.PhysState, LinkLayer: p.LinkLayer,
			RateGbps: p.RateGbps, Width: p.Width, Speed: p.Speed, LID: p.LID, SMLID: p.SMLID,
			Netdev: p.Netdev, RoCEv2GIDIndex: p.RoCEv2GIDIndex,
		}
		for _, g := range p.GIDs {
			port.GIDs = append(port.GIDs, GID(g))
		}
		h.Ports = append(h.Ports, port)
	}
	if o.Uverbs != nil {
		c := CharDevice(*o.Uverbs)
		h.Uverbs = &c
	}
	for _, m := range o.MAD {
		h.MAD = append(h.MAD, CharDevice(m))
	}
	if o.PCI != nil {
		p := PCIInfo(*o.PCI)
		h.PCI = &p
	}
	return h
}
