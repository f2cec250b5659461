package hca

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
)

// pci reads the PCI function behind an ibdev, or nil for software devices,
// and the netdevs of that function (never nil).
func (p *pass) pci(w warner, ib dir) (*PCIInfo, map[string]bool) {
	netdevs := map[string]bool{}
	d := p.openDir(ib, "device")
	defer p.closeDir(d)
	devDir, err := p.realPath(d)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, netdevs
	}
	if err != nil {
		w.add(d.path, err)
		return nil, netdevs
	}
	rel, err := filepath.Rel(p.root, devDir)
	if err != nil || !strings.HasPrefix(rel, "devices"+string(filepath.Separator)+"pci") {
		// A parent that is not PCI (platform or auxiliary bus): no PCI facts.
		return nil, netdevs
	}
	info := &PCIInfo{BusID: filepath.Base(devDir), NUMANode: -1}
	info.PCIeRoot = strings.Split(rel, string(filepath.Separator))[1]
	// Files are named by the resolved path, as before.
	d.path = devDir

	for _, f := range []struct {
		file string
		dst  *string
	}{
		{"vendor", &info.VendorID}, {"device", &info.DeviceID},
		{"subsystem_vendor", &info.SubsystemVendor}, {"subsystem_device", &info.SubsystemDevice},
	} {
		if s, ok := p.readAttr(w, d, f.file); ok {
			if v, err := parsePCIID(s); err != nil {
				w.add(d.join(f.file), err)
			} else {
				*f.dst = v
			}
		}
	}
	if s, ok := p.readAttr(w, d, "numa_node"); ok {
		if n, err := parseNUMANode(s); err != nil {
			w.add(d.join("numa_node"), err)
		} else {
			info.NUMANode = n
		}
	}
	if target, err := p.readlinkIn(d, "driver"); err == nil {
		info.Driver = filepath.Base(target)
	}
	if target, err := p.readlinkIn(d, "physfn"); err == nil {
		info.SRIOV = SRIOVVF
		info.PFBusID = filepath.Base(target)
	} else if s, err := p.readAt(d, "sriov_totalvfs"); err == nil {
		if total, err := strconv.Atoi(s); err == nil && total > 0 {
			info.SRIOV = SRIOVPF
		}
		if s, ok := p.readAttr(w, d, "sriov_numvfs"); ok {
			if n, err := strconv.Atoi(s); err != nil || n < 0 {
				w.add(d.join("sriov_numvfs"), fmt.Errorf("cannot parse %q: want a number", s))
			} else {
				info.NumVFs = n
			}
		}
	}
	if names, err := p.names(d, "net"); err == nil {
		for _, n := range names {
			netdevs[n] = true
		}
	}
	return info, netdevs
}
