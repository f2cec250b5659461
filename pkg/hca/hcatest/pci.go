package hcatest

import (
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// pciNode is one PCI function the builder writes: an HCA's, a declared
// device, or a bridge implied by a path.
type pciNode struct {
	path                                                []string
	vendor, device, subVendor, subDevice, class, driver string // hex without 0x
	numa                                                int
	acs                                                 *uint16
	ats                                                 bool
	vpd                                                 *VPDSpec
	iommu                                               string
}

func (n *pciNode) busID() string { return n.path[len(n.path)-1] }
func (n *pciNode) bridge() bool  { return strings.HasPrefix(n.class, "0604") }

// pciTree collects every function of the spec: HCAs', declared devices
// and the bridges their paths imply (an Intel root port without ACS,
// as on the hosts the older presets model).
func (b *builder) pciTree() {
	b.pci = map[string]*pciNode{}
	add := func(n *pciNode) {
		if _, ok := b.pci[n.busID()]; !ok {
			b.pci[n.busID()] = n
		}
	}
	s := &b.n.Spec
	for i := range s.Devices {
		d := &s.Devices[i]
		add(&pciNode{path: d.Path, vendor: d.Vendor, device: d.Device, subVendor: d.SubsystemVendor, subDevice: d.SubsystemDevice,
			class: d.Class, driver: d.Driver, numa: d.NUMANode, acs: d.ACS, vpd: d.VPD, iommu: d.IOMMUGroup})
	}
	for i := range s.HCAs {
		h := &s.HCAs[i]
		if h.PCI == nil {
			continue
		}
		p := h.PCI
		class := "020700" // InfiniBand controller
		if len(h.Ports) > 0 && h.Ports[0].LinkLayer == "Ethernet" {
			class = "020000"
		}
		add(&pciNode{path: p.Path, vendor: p.Vendor, device: p.Device, subVendor: p.SubsystemVendor, subDevice: p.SubsystemDevice,
			class: class, driver: p.Driver, numa: p.NUMANode, ats: p.ATS, vpd: p.VPD, iommu: p.IOMMUGroup})
	}
	// Implied bridges, each with the NUMA node of the first function found under it.
	var leaves []*pciNode
	for _, n := range b.pci {
		leaves = append(leaves, n)
	}
	sort.Slice(leaves, func(i, j int) bool { return leaves[i].busID() < leaves[j].busID() })
	for _, n := range leaves {
		for k := 1; k < len(n.path)-1; k++ {
			add(&pciNode{path: n.path[:k+1], vendor: "8086", device: "352a", class: "060400", driver: "pcieport", numa: n.numa})
		}
	}
}

// writePCI writes every function that is not an HCA's (pciFunction writes
// those, with their SR-IOV links), parents first.
func (b *builder) writePCI() {
	nodes := make([]*pciNode, 0, len(b.pci))
	for _, n := range b.pci {
		nodes = append(nodes, n)
	}
	sort.Slice(nodes, func(i, j int) bool {
		if len(nodes[i].path) != len(nodes[j].path) {
			return len(nodes[i].path) < len(nodes[j].path)
		}
		return nodes[i].busID() < nodes[j].busID()
	})
	hcas := map[string]bool{}
	for _, h := range b.n.Spec.HCAs {
		if h.PCI != nil {
			hcas[h.PCI.BusID] = true
		}
	}
	for _, n := range nodes {
		if !hcas[n.busID()] {
			b.pciDevice(n)
		}
	}
}

// pciFunction writes an HCA's SR-IOV files and links (pciDevice wrote the rest).
func (b *builder) pciFunction(h *HCASpec, pl place) {
	w, p := b.w, h.PCI
	b.pciDevice(b.pci[p.BusID])
	if p.TotalVFs > 0 {
		w.file(pl.pci+"/sriov_totalvfs", fmt.Sprint(p.TotalVFs))
		w.file(pl.pci+"/sriov_numvfs", fmt.Sprint(len(p.VFs)))
	}
	for i, vf := range p.VFs {
		w.link(fmt.Sprintf("%s/virtfn%d", pl.pci, i), b.pciDir(vf))
	}
	if p.PF != "" {
		w.link(pl.pci+"/physfn", b.pciDir(p.PF))
	}
}

// pciDevice writes a function's directory: IDs, class, modalias, NUMA
// node, config and vpd (binary), driver, subsystem and iommu_group links.
func (b *builder) pciDevice(n *pciNode) {
	w := b.w
	dir := filepath.Join(append([]string{"devices"}, n.path...)...)
	w.dir(filepath.Join("devices", n.path[0]))
	for _, f := range [][2]string{{"vendor", n.vendor}, {"device", n.device}, {"subsystem_vendor", n.subVendor}, {"subsystem_device", n.subDevice}} {
		if f[1] != "" {
			w.file(dir+"/"+f[0], "0x"+f[1])
		}
	}
	w.file(dir+"/class", "0x"+n.class)
	w.file(dir+"/modalias", modalias(n))
	w.file(dir+"/numa_node", fmt.Sprint(n.numa))
	w.raw(dir+"/config", b.configSpace(n))
	if n.vpd != nil {
		w.raw(dir+"/vpd", vpdBytes(*n.vpd))
	}
	w.link(dir+"/subsystem", "bus/pci")
	busID := n.busID()
	w.link("bus/pci/devices/"+busID, dir)
	if n.driver != "" {
		drv := "bus/pci/drivers/" + n.driver
		w.link(dir+"/driver", drv)
		w.link(drv+"/"+busID, dir)
	}
	if n.iommu != "" {
		group := "kernel/iommu_groups/" + n.iommu
		w.link(dir+"/iommu_group", group)
		w.link(group+"/devices/"+busID, dir)
	}
}

// modalias is "pci:v<vendor>d<device>sv<sub>sd<sub>bc<class>sc<sub>i<if>",
// upper-case hex, as the kernel prints it.
func modalias(n *pciNode) string {
	id := func(s string) uint64 { v, _ := strconv.ParseUint(s, 16, 32); return v }
	c := id(n.class)
	return fmt.Sprintf("pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X",
		id(n.vendor), id(n.device), id(n.subVendor), id(n.subDevice), c>>16, c>>8&0xff, c&0xff)
}

// pciDir is the function dir of the HCA with that bus ID (validated to exist).
func (b *builder) pciDir(busID string) string {
	for i := range b.n.Spec.HCAs {
		h := &b.n.Spec.HCAs[i]
		if h.PCI != nil && h.PCI.BusID == busID {
			return placeOf(h).pci
		}
	}
	return ""
}
