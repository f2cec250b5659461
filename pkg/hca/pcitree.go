package hca

// The node's PCI functions as the data path reads them (datapath.go):
// bus/pci/devices with realpaths and modaliases, and each function's VPD,
// config space, NUMA node and IOMMU group, read at most once per pass.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// pciFunc is one function of bus/pci/devices.
type pciFunc struct {
	busID string
	dir   string   // its directory, symlinks resolved
	path  []string // the elements under devices/: root complex first, busID last
	id    pciID
}

// pciTree is the node's PCI functions, read once per full pass when it has
// a PCI HCA, with the binary files read at most once each.
type pciTree struct {
	p     *pass
	byBus map[string]*pciFunc
	gpus  []*pciFunc // sorted by bus ID
	dma   []*pciFunc // Data Direct functions, sorted by bus ID
	vpds  map[string]vpdRead
	cfgs  map[string]cfgRead
}

type vpdRead struct {
	v       vpd
	present bool
	err     error // names the file
}

type cfgRead struct {
	c   pciConfig
	err error // names the file
}

// pciTree lists bus/pci/devices with each function's realpath and
// modalias. A function whose modalias cannot be read is left out, with a
// warning.
func (p *pass) pciTree(warns *[]string) (*pciTree, error) {
	bus := filepath.Join(p.root, "bus", "pci", "devices")
	names, err := dirNames(bus)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	t := &pciTree{p: p, byBus: make(map[string]*pciFunc, len(names)), vpds: map[string]vpdRead{}, cfgs: map[string]cfgRead{}}
	w := warner{warns}
	devices := filepath.Join(p.root, "devices")
	for _, name := range names {
		link := filepath.Join(bus, name)
		target, err := os.Readlink(link)
		if err != nil {
			w.add(link, err)
			continue
		}
		dir := filepath.Join(bus, target)
		rel, err := filepath.Rel(devices, dir)
		elems := strings.Split(rel, string(filepath.Separator))
		if err != nil || !filepath.IsLocal(rel) || len(elems) < 2 || !strings.HasPrefix(elems[0], "pci") || elems[len(elems)-1] != name {
			w.add(link, fmt.Errorf("points to %s, not to devices/pci<root>/.../%s", target, name))
			continue
		}
		f := &pciFunc{busID: name, dir: dir, path: elems}
		if err := p.pciID(f); err != nil {
			w.addErr(err)
			continue
		}
		t.byBus[name] = f
		switch {
		case f.id.vendor == vendorNVIDIA && f.id.class>>16 == classDisplay:
			t.gpus = append(t.gpus, f)
		case f.id.vendor == vendorMellanox && f.id.device == deviceDataDirect:
			t.dma = append(t.dma, f)
		}
	}
	// A Data Direct function that cannot be matched is said once, here.
	for _, f := range t.dma {
		if r := t.vpd(f); r.err != nil {
			*warns = append(*warns, r.err.Error()+": Data Direct function "+f.busID+" cannot be matched to its PF")
		} else if r.v.v3 == "" {
			*warns = append(*warns, filepath.Join(f.dir, "vpd")+": no V3 keyword: Data Direct function "+f.busID+" cannot be matched to its PF")
		}
	}
	return t, nil
}

// pciID reads what a function is from its modalias, or, where a tree has
// none, from its vendor, device and class files; a function with neither
// stays unknown (not a GPU, not a Data Direct function).
func (p *pass) pciID(f *pciFunc) error {
	path := filepath.Join(f.dir, "modalias")
	b, err := p.d.readFile(path)
	if err == nil {
		if f.id, err = parseModalias(string(b)); err != nil {
			return errors.New(fileError(path, err))
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return errors.New(fileError(path, err))
	}
	for _, a := range []struct {
		file string
		bits int
		dst  func(uint64)
	}{
		{"vendor", 16, func(v uint64) { f.id.vendor = uint16(v) }},
		{"device", 16, func(v uint64) { f.id.device = uint16(v) }},
		{"class", 24, func(v uint64) { f.id.class = uint32(v) }},
	} {
		path := filepath.Join(f.dir, a.file)
		b, err := p.d.readFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return errors.New(fileError(path, err))
		}
		v, err := parseHexInt(strings.TrimSpace(string(b)), a.bits)
		if err != nil {
			return errors.New(fileError(path, err))
		}
		a.dst(v)
	}
	return nil
}

// vpd reads a function's vpd file once. A function without one (most
// devices, and every VF) is not an error.
func (t *pciTree) vpd(f *pciFunc) vpdRead {
	if r, ok := t.vpds[f.busID]; ok {
		return r
	}
	var r vpdRead
	path := filepath.Join(f.dir, "vpd")
	b, err := t.p.d.readFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		r.err = errors.New(fileError(path, err))
	default:
		r.present = true
		if r.v, err = parseVPD(b); err != nil {
			r.v, r.err = vpd{}, errors.New(fileError(path, err)) // nothing of a garbled VPD is trusted
		}
	}
	t.vpds[f.busID] = r
	return r
}

// config reads and parses a function's config file once.
func (t *pciTree) config(f *pciFunc) cfgRead {
	if r, ok := t.cfgs[f.busID]; ok {
		return r
	}
	var r cfgRead
	path := filepath.Join(f.dir, "config")
	b, err := t.p.d.readFile(path)
	if err == nil {
		r.c, err = parseConfig(b)
	}
	if err != nil {
		r.err = errors.New(fileError(path, err))
	}
	t.cfgs[f.busID] = r
	return r
}

// numaNode is a function's numa_node, -1 when unknown.
func (t *pciTree) numaNode(f *pciFunc) int {
	b, err := t.p.d.readFile(filepath.Join(f.dir, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := parseNUMANode(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

// iommuGroup is the name of a function's IOMMU group, "" without one.
func iommuGroup(f *pciFunc) string {
	target, err := os.Readlink(filepath.Join(f.dir, "iommu_group"))
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}

func busIDs(fs []*pciFunc) []string {
	if len(fs) == 0 {
		return nil
	}
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.busID
	}
	return out
}
