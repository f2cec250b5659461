package hcatest

import (
	"fmt"
	"path/filepath"
	"strings"
)

// validName rejects names that would escape or break a path.
func validName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00")
}

func validate(s Spec) error {
	names := map[string]bool{}
	uverbs := map[int]string{}
	umads := map[int]string{}
	buses := map[string]*HCASpec{}
	hwNetdevs := map[string]string{}
	for i := range s.HCAs {
		h := &s.HCAs[i]
		if !validName(h.Name) {
			return fmt.Errorf("hcatest: HCA %d: invalid name %q", i, h.Name)
		}
		if names[h.Name] {
			return fmt.Errorf("hcatest: HCA %s: duplicate name", h.Name)
		}
		names[h.Name] = true
		if h.Uverbs < -1 {
			return fmt.Errorf("hcatest: HCA %s: uverbs index %d", h.Name, h.Uverbs)
		}
		if h.Uverbs >= 0 {
			if other, ok := uverbs[h.Uverbs]; ok {
				return fmt.Errorf("hcatest: HCA %s: uverbs%d already used by %s", h.Name, h.Uverbs, other)
			}
			uverbs[h.Uverbs] = h.Name
		}
		for j, p := range h.Ports {
			if p.UMAD < -1 {
				return fmt.Errorf("hcatest: HCA %s port %d: umad index %d", h.Name, j+1, p.UMAD)
			}
			if p.UMAD >= 0 {
				if other, ok := umads[p.UMAD]; ok {
					return fmt.Errorf("hcatest: HCA %s port %d: umad%d already used by %s", h.Name, j+1, p.UMAD, other)
				}
				umads[p.UMAD] = h.Name
			}
			if p.GIDTableLen < 0 {
				return fmt.Errorf("hcatest: HCA %s port %d: GID table length %d", h.Name, j+1, p.GIDTableLen)
			}
			seen := map[int]bool{}
			for _, g := range p.GIDs {
				if g.Index < 0 || g.Index >= p.GIDTableLen || seen[g.Index] {
					return fmt.Errorf("hcatest: HCA %s port %d: bad or duplicate GID index %d (table length %d)", h.Name, j+1, g.Index, p.GIDTableLen)
				}
				seen[g.Index] = true
				if g.Netdev != "" && !validName(g.Netdev) {
					return fmt.Errorf("hcatest: HCA %s port %d: invalid GID netdev %q", h.Name, j+1, g.Netdev)
				}
			}
		}
		own := map[string]bool{}
		for _, nd := range h.Netdevs {
			if !validName(nd) || own[nd] {
				return fmt.Errorf("hcatest: HCA %s: invalid or duplicate netdev %q", h.Name, nd)
			}
			own[nd] = true
			if h.PCI == nil {
				continue
			}
			if other, ok := hwNetdevs[nd]; ok {
				return fmt.Errorf("hcatest: HCA %s: netdev %s already belongs to %s", h.Name, nd, other)
			}
			hwNetdevs[nd] = h.Name
		}
		for k := range h.Corrupt {
			rel, pci := strings.CutPrefix(k, "pci:")
			if !filepath.IsLocal(rel) || (pci && h.PCI == nil) {
				return fmt.Errorf("hcatest: HCA %s: bad Corrupt key %q", h.Name, k)
			}
		}
		if h.PCI == nil {
			continue
		}
		p := h.PCI
		if !validName(p.BusID) {
			return fmt.Errorf("hcatest: HCA %s: invalid PCI bus ID %q", h.Name, p.BusID)
		}
		if len(p.Path) < 2 || p.Path[len(p.Path)-1] != p.BusID {
			return fmt.Errorf("hcatest: HCA %s: PCI path %q must be a root then at least the function %s", h.Name, p.Path, p.BusID)
		}
		for _, e := range p.Path {
			if !validName(e) {
				return fmt.Errorf("hcatest: HCA %s: invalid PCI path element %q", h.Name, e)
			}
		}
		if p.Driver != "" && !validName(p.Driver) {
			return fmt.Errorf("hcatest: HCA %s: invalid driver %q", h.Name, p.Driver)
		}
		if other, ok := buses[p.BusID]; ok {
			return fmt.Errorf("hcatest: HCA %s: PCI function %s already belongs to %s", h.Name, p.BusID, other.Name)
		}
		buses[p.BusID] = h
		if len(p.VFs) > 0 && p.TotalVFs < len(p.VFs) {
			return fmt.Errorf("hcatest: HCA %s: %d VFs but sriov_totalvfs %d", h.Name, len(p.VFs), p.TotalVFs)
		}
		if p.PF != "" && (p.TotalVFs > 0 || len(p.VFs) > 0) {
			return fmt.Errorf("hcatest: HCA %s: a VF cannot have VFs", h.Name)
		}
	}
	for i, d := range s.Devices {
		if len(d.Path) < 2 {
			return fmt.Errorf("hcatest: device %d: PCI path %q must be a root then at least the function", i, d.Path)
		}
		for _, e := range d.Path {
			if !validName(e) {
				return fmt.Errorf("hcatest: device %d: invalid PCI path element %q", i, e)
			}
		}
		if _, ok := buses[d.BusID()]; ok {
			return fmt.Errorf("hcatest: device %s: PCI function already belongs to an HCA", d.BusID())
		}
		if len(d.Class) != 6 || strings.Trim(d.Class, "0123456789abcdef") != "" {
			return fmt.Errorf("hcatest: device %s: class %q is not six hex digits", d.BusID(), d.Class)
		}
		if d.Driver != "" && !validName(d.Driver) {
			return fmt.Errorf("hcatest: device %s: invalid driver %q", d.BusID(), d.Driver)
		}
	}
	// SR-IOV references must name HCAs that agree with each other.
	for _, h := range buses {
		for _, vf := range h.PCI.VFs {
			v, ok := buses[vf]
			if !ok || v.PCI.PF != h.PCI.BusID {
				return fmt.Errorf("hcatest: HCA %s: VF %s is not an HCA whose PF is %s", h.Name, vf, h.PCI.BusID)
			}
		}
		if h.PCI.PF != "" {
			pf, ok := buses[h.PCI.PF]
			if !ok || !contains(pf.PCI.VFs, h.PCI.BusID) {
				return fmt.Errorf("hcatest: HCA %s: PF %s is not an HCA listing %s as a VF", h.Name, h.PCI.PF, h.PCI.BusID)
			}
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}
