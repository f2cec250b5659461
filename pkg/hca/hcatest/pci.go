package hcatest

import (
	"fmt"
	"path/filepath"
)

// pciFunction writes the function dir, its bridges, driver and SR-IOV links.
func (b *builder) pciFunction(h *HCASpec, pl place) {
	w, p := b.w, h.PCI
	class := "0x020700" // InfiniBand controller
	if len(h.Ports) > 0 && h.Ports[0].LinkLayer == "Ethernet" {
		class = "0x020000"
	}
	// Bridges between the root complex and the function.
	dir := filepath.Join("devices", p.Path[0])
	w.dir(dir)
	for _, br := range p.Path[1 : len(p.Path)-1] {
		dir = filepath.Join(dir, br)
		if b.written[dir] {
			continue
		}
		b.written[dir] = true
		// An Intel PCIe root port, as on the hosts these presets model.
		b.pciDevice(dir, br, pciIDs{vendor: "0x8086", device: "0x352a", class: "0x060400", driver: "pcieport", numa: p.NUMANode})
	}
	b.pciDevice(pl.pci, p.BusID, pciIDs{
		vendor: hexID(p.Vendor), device: hexID(p.Device),
		subVendor: hexID(p.SubsystemVendor), subDevice: hexID(p.SubsystemDevice),
		class: class, driver: p.Driver, numa: p.NUMANode,
	})
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

// pciIDs are the attributes of one PCI function dir; empty IDs are not
// written.
type pciIDs struct {
	vendor, device, subVendor, subDevice, class, driver string
	numa                                                int
}

func (b *builder) pciDevice(dir, busID string, ids pciIDs) {
	w := b.w
	for _, f := range [][2]string{{"vendor", ids.vendor}, {"device", ids.device}, {"subsystem_vendor", ids.subVendor}, {"subsystem_device", ids.subDevice}} {
		if f[1] != "" {
			w.file(dir+"/"+f[0], f[1])
		}
	}
	w.file(dir+"/class", ids.class)
	w.file(dir+"/numa_node", fmt.Sprint(ids.numa))
	w.link(dir+"/subsystem", "bus/pci")
	w.link("bus/pci/devices/"+busID, dir)
	if ids.driver != "" {
		drv := "bus/pci/drivers/" + ids.driver
		w.link(dir+"/driver", drv)
		w.link(drv+"/"+busID, dir)
	}
}

// hexID is a PCI ID as sysfs prints it ("15b3" => "0x15b3"), "" for none.
func hexID(id string) string {
	if id == "" {
		return ""
	}
	return "0x" + id
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
