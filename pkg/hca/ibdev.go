package hca

import (
	"path/filepath"
	"slices"
	"strings"
)

// hca reads one ibdev directory.
func (p *pass) hca(name string) HCA {
	h := HCA{Name: name}
	w := warner{&h.Warnings}
	dir := p.openDir(p.ibClass, name)
	defer p.closeDir(dir)

	if s, ok := p.readAttr(w, dir, "node_type"); ok {
		if _, word, err := parseNumberedWord(s); err != nil {
			w.add(dir.join("node_type"), err)
		} else {
			h.NodeType = word
		}
	}
	for _, g := range []struct {
		file string
		dst  *string
	}{{"node_guid", &h.NodeGUID}, {"sys_image_guid", &h.SysImageGUID}} {
		if s, ok := p.readAttr(w, dir, g.file); ok {
			if v, err := parseGUID(s); err != nil {
				w.add(dir.join(g.file), err)
			} else {
				*g.dst = v
			}
		}
	}
	h.FirmwareVer, _ = p.readAttr(w, dir, "fw_ver")
	h.NodeDesc, _ = p.readAttr(w, dir, "node_desc")
	h.HCAType = p.readOptional(w, dir, "hca_type")
	h.BoardID = p.readOptional(w, dir, "board_id")

	h.Ports = p.ports(w, dir)
	var netdevs map[string]bool
	h.PCI, netdevs = p.pci(w, dir)
	h.Software = h.PCI == nil && p.isVirtual(dir)

	for _, port := range h.Ports {
		for _, g := range port.GIDs {
			if g.Netdev != "" {
				netdevs[g.Netdev] = true
				if h.Software && h.ParentNetdev == "" {
					h.ParentNetdev = g.Netdev
				}
			}
		}
	}
	if h.Software && h.ParentNetdev == "" {
		h.ParentNetdev = p.readOptional(w, dir, "parent")
	}
	for n := range netdevs {
		h.Netdevs = append(h.Netdevs, n)
	}
	slices.Sort(h.Netdevs)

	switch {
	case h.PCI != nil:
		h.Model = modelName(h.PCI.VendorID, h.PCI.DeviceID)
	case h.Software && h.NodeType == "RNIC":
		h.Model = "soft-iWARP"
	case h.Software:
		h.Model = "Soft-RoCE"
	}
	if h.Model == "" {
		h.Model = h.HCAType
	}
	return h
}

// isVirtual reports whether an ibdev lives under devices/virtual (no parent
// device), as rxe and siw do.
func (p *pass) isVirtual(d dir) bool {
	real, err := p.realPath(d)
	if err != nil {
		return false
	}
	rel, err := filepath.Rel(p.root, real)
	return err == nil && strings.HasPrefix(rel, filepath.Join("devices", "virtual")+string(filepath.Separator))
}
