package hcatest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// place says where an HCA's devices live, relative to the sysfs root.
type place struct {
	pci  string // devices/<pci path>; "" for a software device
	name string
}

func placeOf(h *HCASpec) place {
	if h.PCI == nil {
		return place{name: h.Name}
	}
	return place{pci: filepath.Join(append([]string{"devices"}, h.PCI.Path...)...), name: h.Name}
}

// dev is the directory of a class device of this HCA: under the PCI
// function, or under devices/virtual for software devices.
func (p place) dev(class, name string) string {
	if p.pci == "" {
		return filepath.Join("devices", "virtual", class, name)
	}
	return filepath.Join(p.pci, class, name)
}

func (p place) ibdev() string { return p.dev("infiniband", p.name) }

type builder struct {
	n       *Node
	w       *writer
	ifindex int
	written map[string]bool     // netdevs already written
	pci     map[string]*pciNode // every PCI function, by bus ID
}

func (b *builder) build() error {
	b.written = map[string]bool{}
	s := &b.n.Spec
	w := b.w
	for _, d := range []string{"class/infiniband", "class/net", "class/misc", "bus/pci/devices", "bus/pci/drivers", "devices/virtual"} {
		w.dir(d)
	}
	w.file("class/infiniband_verbs/abi_version", "6")
	w.file("class/infiniband_mad/abi_version", "5")
	netns := "N"
	if s.NetnsShared {
		netns = "Y"
	}
	w.file("module/ib_core/parameters/netns_mode", netns)
	b.netdev(place{}, "lo", "00:00:00:00:00:00", "772") // ARPHRD_LOOPBACK
	if w.err != nil {
		return w.err
	}
	if err := os.MkdirAll(filepath.Join(b.n.DevRoot, "infiniband"), 0o755); err != nil {
		return err
	}
	if s.RDMACMMinor != 0 {
		d := "devices/virtual/misc/rdma_cm"
		dn := devNum{miscMajor, s.RDMACMMinor}
		w.file(d+"/dev", dn.String())
		w.link("class/misc/rdma_cm", d)
		if err := b.charDev("rdma_cm", dn); err != nil {
			return err
		}
	}
	b.pciTree()
	b.writePCI()
	hw := map[string]bool{}
	for _, h := range s.HCAs {
		if h.PCI != nil {
			for _, nd := range h.Netdevs {
				hw[nd] = true
			}
		}
	}
	for i := range s.HCAs {
		if err := b.hca(&s.HCAs[i], hw); err != nil {
			return err
		}
	}
	for i := range s.HCAs {
		if err := b.corrupt(&s.HCAs[i]); err != nil {
			return err
		}
	}
	if s.ForeignNetns && !s.NetnsShared {
		return b.hideIBDevs()
	}
	return nil
}

// hideIBDevs removes what sysfs does not show outside the devices' network
// namespace in exclusive mode: the class/infiniband links and the ibdev
// directories (with their glue directory once empty).
func (b *builder) hideIBDevs() error {
	for i := range b.n.Spec.HCAs {
		pl := placeOf(&b.n.Spec.HCAs[i])
		for _, rel := range []string{"class/infiniband/" + pl.name, pl.ibdev()} {
			path := filepath.Join(b.n.SysfsRoot, rel)
			if err := os.RemoveAll(path); err != nil {
				return err
			}
			b.n.dropFaults(path)
		}
		if pl.pci != "" {
			_ = os.Remove(filepath.Join(b.n.SysfsRoot, pl.pci, "infiniband"))
		}
	}
	b.w.dirs = map[string]bool{}
	return nil
}

func (b *builder) hca(h *HCASpec, hwNetdevs map[string]bool) error {
	w, pl := b.w, placeOf(h)
	ib := pl.ibdev()
	if pl.pci != "" {
		b.pciFunction(h, pl)
		w.link(ib+"/device", pl.pci)
	}
	w.link("class/infiniband/"+h.Name, ib)
	w.file(ib+"/node_type", h.NodeType)
	w.file(ib+"/node_guid", h.NodeGUID)
	w.file(ib+"/sys_image_guid", h.SysImageGUID)
	w.file(ib+"/fw_ver", h.FWVer)
	desc := h.NodeDesc
	if desc == "" {
		desc = strings.TrimSpace(b.n.Spec.Hostname + " " + h.Name)
	}
	w.file(ib+"/node_desc", desc)
	if pl.pci == "" && h.NodeType == "1: CA" && len(h.Netdevs) > 0 {
		w.file(ib+"/parent", h.Netdevs[0]) // rxe's driver attribute
	}
	if h.HCAType != "" {
		w.file(ib+"/hca_type", h.HCAType)
	}
	if h.BoardID != "" {
		w.file(ib+"/board_id", h.BoardID)
	}
	w.dir(ib + "/ports")
	for i := range h.Ports {
		b.port(h, pl, i+1)
	}
	if h.Uverbs >= 0 {
		name := fmt.Sprintf("uverbs%d", h.Uverbs)
		d := pl.dev("infiniband_verbs", name)
		dn := uverbsDev(h.Uverbs)
		w.file(d+"/ibdev", h.Name)
		w.file(d+"/dev", dn.String())
		w.file(d+"/abi_version", uverbsABI(h))
		if pl.pci != "" {
			w.link(d+"/device", pl.pci)
		}
		w.link("class/infiniband_verbs/"+name, d)
		if err := b.charDev(name, dn); err != nil {
			return err
		}
	}
	for i, p := range h.Ports {
		if p.UMAD < 0 {
			continue
		}
		for _, m := range []struct {
			name string
			dn   devNum
		}{{fmt.Sprintf("umad%d", p.UMAD), umadDev(p.UMAD)}, {fmt.Sprintf("issm%d", p.UMAD), issmDev(p.UMAD)}} {
			d := pl.dev("infiniband_mad", m.name)
			w.file(d+"/ibdev", h.Name)
			w.file(d+"/port", fmt.Sprint(i+1))
			w.file(d+"/dev", m.dn.String())
			if pl.pci != "" {
				w.link(d+"/device", pl.pci)
			}
			w.link("class/infiniband_mad/"+m.name, d)
			if err := b.charDev(m.name, m.dn); err != nil {
				return err
			}
		}
	}
	ethernet := len(h.Ports) > 0 && h.Ports[0].LinkLayer == "Ethernet"
	for k, nd := range h.Netdevs {
		if pl.pci == "" && hwNetdevs[nd] {
			continue // the parent is a hardware HCA's netdev
		}
		typ := "32" // ARPHRD_INFINIBAND
		if ethernet {
			typ = "1" // ARPHRD_ETHER
		}
		b.netdev(pl, nd, netdevAddress(h.NodeGUID, k, ethernet), typ)
	}
	return w.err
}

func (b *builder) port(h *HCASpec, pl place, num int) {
	w, p := b.w, h.Ports[num-1]
	d := fmt.Sprintf("%s/ports/%d", pl.ibdev(), num)
	ethernet := p.LinkLayer == "Ethernet"
	capMask := "0xa751e848" // mlx5 InfiniBand
	rnic := h.NodeType == "4: RNIC"
	switch {
	case pl.pci == "" && rnic:
		capMask = "0x00090000" // siw (Linux 6.1)
	case pl.pci == "":
		capMask = "0x00010000" // rxe (Linux 6.1)
	case ethernet:
		capMask = "0x04010000"
	}
	w.file(d+"/state", p.State)
	w.file(d+"/phys_state", p.PhysState)
	w.file(d+"/link_layer", p.LinkLayer)
	w.file(d+"/rate", p.Rate)
	w.file(d+"/lid", fmt.Sprintf("0x%x", p.LID))
	w.file(d+"/sm_lid", fmt.Sprintf("0x%x", p.SMLID))
	w.file(d+"/sm_sl", "0")
	w.file(d+"/lid_mask_count", "0")
	w.file(d+"/cap_mask", capMask)
	if !rnic { // iWARP has no P_Key table
		pkeys := p.PKeys
		if len(pkeys) == 0 {
			pkeys = []string{"0xffff"}
		}
		n := len(pkeys)
		if !ethernet && pl.pci != "" {
			n = max(n, 128)
		}
		for i := range n {
			v := "0x0000"
			if i < len(pkeys) {
				v = pkeys[i]
			}
			w.file(fmt.Sprintf("%s/pkeys/%d", d, i), v)
		}
	}
	gids := make(map[int]GIDSpec, len(p.GIDs))
	for _, g := range p.GIDs {
		gids[g.Index] = g
	}
	for i := 0; i < p.GIDTableLen; i++ {
		gid := fmt.Sprintf("%s/gids/%d", d, i)
		typ := fmt.Sprintf("%s/gid_attrs/types/%d", d, i)
		ndev := fmt.Sprintf("%s/gid_attrs/ndevs/%d", d, i)
		g, ok := gids[i]
		if !ok {
			w.file(gid, "0000:0000:0000:0000:0000:0000:0000:0000")
			b.fault(typ, syscall.EINVAL)
			b.fault(ndev, syscall.EINVAL)
			continue
		}
		w.file(gid, g.GID)
		w.file(typ, g.Type)
		if ethernet && g.Netdev != "" {
			w.file(ndev, g.Netdev)
		} else {
			b.fault(ndev, syscall.EINVAL)
		}
	}
}

func (b *builder) fault(rel string, errno syscall.Errno) {
	b.w.empty(rel)
	b.n.Faults[filepath.Join(b.n.SysfsRoot, rel)] = errno
}

// corrupt applies h.Corrupt in key order.
func (b *builder) corrupt(h *HCASpec) error {
	keys := make([]string, 0, len(h.Corrupt))
	for k := range h.Corrupt {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	pl := placeOf(h)
	for _, k := range keys {
		v := h.Corrupt[k]
		rel := filepath.Join(pl.ibdev(), k)
		if r, ok := strings.CutPrefix(k, "pci:"); ok {
			rel = filepath.Join(pl.pci, r)
		}
		path := filepath.Join(b.n.SysfsRoot, rel)
		if _, err := os.Lstat(path); err != nil && (v == "" || !errors.Is(err, fs.ErrNotExist)) {
			return fmt.Errorf("corrupt %s of %s: %w", k, h.Name, err)
		}
		if err := os.RemoveAll(path); err != nil {
			return err
		}
		b.n.dropFaults(path)
		b.w.dirs = map[string]bool{} // path may have been a cached dir
		if v != "" {
			b.w.file(rel, v)
		}
	}
	return b.w.err
}

// uverbsABI is the driver's uverbs ABI version in uverbsN/abi_version: rxe
// (a software CA) has 2, siw and mlx5 have 1 (seen in test/vm).
func uverbsABI(h *HCASpec) string {
	if h.PCI == nil && h.NodeType != "4: RNIC" {
		return "2"
	}
	return "1"
}
