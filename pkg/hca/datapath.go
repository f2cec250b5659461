package hca

// The data path of an HCA: the PCI function GPU peer-to-peer DMA (GPUDirect
// RDMA) enters it by, the GPUs near that function, its board, and whether
// the PCIe switch they share lets the traffic turn there.
//
// The model is rdma-core's kernel-boot/rdma_topo, read from sysfs only:
// realpaths of bus/pci/devices, modalias, config (the extended capability
// list) and vpd. On a ConnectX-8 "Data Direct" card the HCA's PF does no
// GPU DMA: a DMA function (15b3:2100) of the same card does, under the
// ConnectX switch that also leads to the GPU; the two are one card when
// their VPDs carry the same V3 keyword. Everything else (a PF beside its
// GPUs under a switch, Grace root ports with NUMA-only placement) is the
// PF's own path. What cannot be read or matched leaves the PF's answer and
// a warning that names the file.

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// GPULink is how near an HCA's data path function its GPUs are.
type GPULink string

const (
	GPULinkNone GPULink = ""
	// GPULinkSwitch: the function and the GPUs hang under one PCIe bridge
	// below the root port (a switch): peer-to-peer turns in the switch.
	GPULinkSwitch GPULink = "switch"
	// GPULinkRootComplex: only the root complex is shared; peer-to-peer
	// crosses the host bridge.
	GPULinkRootComplex GPULink = "root-complex"
	// GPULinkNUMA: no PCIe in common, the same NUMA node (Grace root ports).
	GPULinkNUMA GPULink = "numa"
)

// GPUDirect is whether GPU peer-to-peer DMA can turn in the shared switch.
// It is judged only for GPULinkSwitch: elsewhere no ACS setting decides it.
type GPUDirect string

const (
	GPUDirectNotJudged GPUDirect = ""
	GPUDirectReady     GPUDirect = "ready"
	GPUDirectNotReady  GPUDirect = "not-ready"
	GPUDirectUnknown   GPUDirect = "unknown"
)

// DataPath is where an HCA's GPU peer-to-peer DMA enters the PCI fabric.
type DataPath struct {
	// Function is the PCI function the DMA enters by: the HCA's own, or the
	// Data Direct DMA function of its card.
	Function   string
	DataDirect bool
	// PCIeRoot is Function's root complex (pci0008:00).
	PCIeRoot string
	// GPUs are the NVIDIA GPUs nearest Function, sorted, and how near.
	GPUs    []string
	GPULink GPULink
	// Shared is the bridge Function and the GPUs both hang under
	// (GPULinkSwitch only): peer-to-peer turns at its downstream ports.
	Shared string
	// Board and Product are the card's VPD serial number (SN) and name.
	Board, Product string
	// ACS is the ACS control of the shared bridge's downstream ports on the
	// way to Function and to each GPU.
	ACS []ACSPort
	// GPUDirect and why it is not ready or unknown: GPUDirectCause is a
	// short code (GPUDirectCause*), GPUDirectReason the sentence naming the
	// ports and functions.
	GPUDirect       GPUDirect
	GPUDirectCause  string
	GPUDirectReason string
}

// Causes of a GPUDirect that is not ready or unknown: label values.
const (
	// GPUDirectCauseACS: ACS P2P Request Redirect on the switch port toward
	// the data path function sends its peer-to-peer DMA through the root port.
	GPUDirectCauseACS = "acs-redirects-p2p"
	// GPUDirectCauseIOMMU: the Data Direct function and its GPU are in
	// different IOMMU groups, and the GPU driver refuses peer-to-peer.
	GPUDirectCauseIOMMU = "iommu-groups-split"
	// GPUDirectCauseUnreadable: the ACS of the switch port could not be read.
	GPUDirectCauseUnreadable = "acs-unreadable"
)

// ACSPort is one switch downstream port on a data path.
type ACSPort struct {
	BusID  string // the port
	Toward string // the function behind it
	HasACS bool
	// Control is its ACS Control Register (SV, TB, RR, CR, UF, EC, DT).
	Control uint16
}

func (a ACSPort) String() string {
	acs := "no ACS"
	if a.HasACS {
		acs = "ACS " + acsString(a.Control)
	}
	return fmt.Sprintf("%s toward %s: %s", a.BusID, a.Toward, acs)
}

// PCI IDs the data path cares about.
const (
	vendorMellanox   = 0x15b3
	vendorNVIDIA     = 0x10de
	deviceDataDirect = 0x2100 // ConnectX-8 DMA function
	classDisplay     = 0x03   // base class of VGA and 3D controllers
)

// dataDirectCapable are ConnectX devices whose card may carry a Data Direct
// DMA function (rdma_topo's cx_nic entries that can: ConnectX-8, -9).
var dataDirectCapable = map[uint16]bool{0x1023: true, 0x1025: true}

// dataPaths fills DataPath of every PCI HCA.
func (p *pass) dataPaths(inv *Inventory) {
	if !slices.ContainsFunc(inv.HCAs, func(h HCA) bool { return h.PCI != nil }) {
		return
	}
	t, err := p.pciTree(&inv.Warnings)
	if err != nil {
		inv.Warnings = append(inv.Warnings, err.Error()+": no HCA's GPU data path is known")
		return
	}
	for i := range inv.HCAs {
		h := &inv.HCAs[i]
		if h.PCI != nil {
			h.DataPath = t.dataPath(h, warner{&h.Warnings})
		}
	}
}

// dataPath works out one HCA's data path; nil when its function is not in
// the tree (a warning says so).
func (t *pciTree) dataPath(h *HCA, w warner) *DataPath {
	fn := t.byBus[h.PCI.BusID]
	if fn == nil {
		w.addErr(fmt.Errorf("%s is not listed in bus/pci/devices: its GPU data path is unknown", h.PCI.BusID))
		return nil
	}
	dp := &DataPath{Function: fn.busID, PCIeRoot: fn.path[0]}
	board := fn
	if h.PCI.SRIOV == SRIOVVF {
		board = t.byBus[h.PCI.PFBusID]
	}
	entry := fn
	if board != nil {
		r := t.vpd(board)
		if r.err != nil {
			w.addErr(r.err)
		}
		dp.Board, dp.Product = r.v.serial, r.v.name
		if board == fn {
			if dma := t.dataDirect(fn, r, w); dma != nil {
				entry, dp.DataDirect = dma, true
				dp.Function, dp.PCIeRoot = dma.busID, dma.path[0]
			}
		}
	}
	t.nearGPUs(entry, h, dp)
	if dp.GPULink == GPULinkSwitch {
		t.judge(entry, dp, w)
	}
	return dp
}

// dataDirect is the Data Direct function of fn's card: the one whose VPD
// V3 is fn's. nil when there is none, or when the match cannot be made
// (then a warning says why and the PF stays the data path).
func (t *pciTree) dataDirect(fn *pciFunc, r vpdRead, w warner) *pciFunc {
	if len(t.dma) == 0 || fn.id.vendor != vendorMellanox {
		return nil
	}
	var match []*pciFunc
	if r.v.v3 != "" {
		for _, d := range t.dma {
			if dr := t.vpd(d); dr.err == nil && dr.v.v3 == r.v.v3 {
				match = append(match, d)
			}
		}
	}
	vpdPath := filepath.Join(fn.dir, "vpd")
	switch {
	case len(match) == 1:
		return match[0]
	case len(match) > 1:
		w.addErr(fmt.Errorf("%s: V3 %q is carried by the Data Direct functions %s alike: its GPU data path is taken to be the PF", vpdPath, r.v.v3, strings.Join(busIDs(match), ", ")))
	case !dataDirectCapable[fn.id.device]:
	case r.err != nil:
		// Said already; say what it costs.
		w.addErr(fmt.Errorf("%s unreadable: %s cannot be matched to the Data Direct functions %s: its GPU data path is taken to be the PF", vpdPath, fn.busID, strings.Join(busIDs(t.dma), ", ")))
	case !r.present || r.v.v3 == "":
		w.addErr(fmt.Errorf("%s has no V3 keyword: %s cannot be matched to the Data Direct functions %s: its GPU data path is taken to be the PF", vpdPath, fn.busID, strings.Join(busIDs(t.dma), ", ")))
	}
	return nil
}

// nearGPUs fills the GPUs nearest entry: those sharing the deepest bridge
// with it, else its root complex, else its NUMA node.
func (t *pciTree) nearGPUs(entry *pciFunc, h *HCA, dp *DataPath) {
	best := 0
	var near []*pciFunc
	for _, g := range t.gpus {
		n := 0
		for n < len(entry.path)-1 && n < len(g.path)-1 && entry.path[n] == g.path[n] {
			n++
		}
		switch {
		case n == 0 || n < best:
			continue
		case n > best:
			best, near = n, nil
		}
		near = append(near, g)
	}
	switch {
	case best >= 2:
		dp.GPULink, dp.Shared = GPULinkSwitch, entry.path[best-1]
	case best == 1:
		dp.GPULink = GPULinkRootComplex
	default:
		numa := h.PCI.NUMANode
		if entry != t.byBus[h.PCI.BusID] {
			numa = t.numaNode(entry)
		}
		if numa < 0 {
			return
		}
		for _, g := range t.gpus {
			if t.numaNode(g) == numa {
				near = append(near, g)
			}
		}
		if len(near) > 0 {
			dp.GPULink = GPULinkNUMA
		}
	}
	dp.GPUs = busIDs(near)
	if dp.GPULink != GPULinkSwitch {
		return
	}
	// The shared bridge's downstream ports toward entry and each GPU.
	depth := best
	seen := map[string]bool{}
	for _, f := range append([]*pciFunc{entry}, near...) {
		port := f.path[depth]
		if port == f.busID || seen[port] {
			continue // f sits right on the shared bridge's bus
		}
		seen[port] = true
		a := ACSPort{BusID: port, Toward: f.busID}
		if pf := t.byBus[port]; pf != nil {
			if r := t.config(pf); r.err == nil {
				a.HasACS, a.Control = r.c.hasACS, r.c.acsControl
			}
		}
		dp.ACS = append(dp.ACS, a)
	}
}

// judge decides GPUDirect for a switch-shared data path, as rdma_topo's
// check does: the switch port toward the data path function must not
// redirect its peer-to-peer requests upstream (ACS P2P Request Redirect),
// unless they are ATS-translated and the port passes those directly; and a
// Data Direct function must share its GPU's IOMMU group, or the GPU driver
// refuses peer-to-peer between them.
func (t *pciTree) judge(entry *pciFunc, dp *DataPath, w warner) {
	var notReady, unknown, causes []string
	depth := slices.Index(entry.path, dp.Shared) + 1
	if port := entry.path[depth]; port != entry.busID {
		pf := t.byBus[port]
		var r cfgRead
		if pf == nil {
			r.err = fmt.Errorf("%s is not listed in bus/pci/devices", port)
		} else {
			r = t.config(pf)
		}
		switch {
		case r.err != nil:
			w.addErr(r.err)
			unknown = append(unknown, "the ACS of switch port "+port+" is unknown ("+r.err.Error()+")")
			causes = append(causes, GPUDirectCauseUnreadable)
		case r.c.hasACS && r.c.acsControl&acsRequestRedirect != 0:
			direct := false
			if r.c.acsControl&acsDirectTranslated != 0 {
				ec := t.config(entry)
				direct = ec.err == nil && ec.c.hasATS
			}
			if !direct {
				causes = append(causes, GPUDirectCauseACS)
				notReady = append(notReady, fmt.Sprintf(
					"ACS P2P Request Redirect is set on switch port %s toward %s: its peer-to-peer DMA to GPU %s goes up through the root port",
					port, entry.busID, strings.Join(dp.GPUs, ", ")))
			}
		}
	}
	if dp.DataDirect {
		eg := iommuGroup(entry)
		for _, g := range dp.GPUs {
			gg := iommuGroup(t.byBus[g])
			if eg != "" && gg != "" && eg != gg {
				causes = append(causes, GPUDirectCauseIOMMU)
				notReady = append(notReady, fmt.Sprintf(
					"Data Direct function %s (IOMMU group %s) and GPU %s (group %s) are in different IOMMU groups: the GPU driver refuses peer-to-peer between them",
					entry.busID, eg, g, gg))
			}
		}
	}
	switch {
	case len(notReady) > 0:
		dp.GPUDirect, dp.GPUDirectReason = GPUDirectNotReady, strings.Join(notReady, "; ")
		dp.GPUDirectCause = causes[slices.IndexFunc(causes, func(c string) bool { return c != GPUDirectCauseUnreadable })]
	case len(unknown) > 0:
		dp.GPUDirect, dp.GPUDirectReason, dp.GPUDirectCause = GPUDirectUnknown, strings.Join(unknown, "; "), GPUDirectCauseUnreadable
	default:
		dp.GPUDirect = GPUDirectReady
	}
}
