package hcatest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ReadFile reads like the kernel would: a path in Faults (directly or
// through symlinks, e.g. via class/infiniband/<ib>) fails with
// &fs.PathError{Op: "read", Path: path, Err: errno}; anything else is
// os.ReadFile. Pass it to discovery in place of os.ReadFile. Safe for
// concurrent use as long as no mutation runs at the same time.
func (n *Node) ReadFile(path string) ([]byte, error) {
	if errno, ok := n.fault(path); ok {
		return nil, &fs.PathError{Op: "read", Path: path, Err: errno}
	}
	return os.ReadFile(path)
}

func (n *Node) fault(path string) (syscall.Errno, bool) {
	if len(n.Faults) == 0 {
		return 0, false
	}
	p := filepath.Clean(path)
	if errno, ok := n.Faults[p]; ok {
		return errno, true
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return 0, false
	}
	realSys := n.realSys
	if realSys == "" {
		if realSys, err = filepath.EvalSymlinks(n.SysfsRoot); err != nil {
			return 0, false
		}
	}
	rel, err := filepath.Rel(realSys, real)
	if err != nil || !filepath.IsLocal(rel) {
		return 0, false
	}
	errno, ok := n.Faults[filepath.Join(n.SysfsRoot, rel)]
	return errno, ok
}

// ibdevsHidden is true when sysfs shows no ibdev (Spec.ForeignNetns).
func (n *Node) ibdevsHidden() bool { return n.Spec.ForeignNetns && !n.Spec.NetnsShared }

// dropFaults forgets the faults at or under path, once it is gone or
// rewritten.
func (n *Node) dropFaults(path string) {
	for k := range n.Faults {
		if k == path || strings.HasPrefix(k, path+string(filepath.Separator)) {
			delete(n.Faults, k)
		}
	}
}

func (n *Node) hca(ibdev string) (*HCASpec, int, error) {
	for i := range n.Spec.HCAs {
		if n.Spec.HCAs[i].Name == ibdev {
			return &n.Spec.HCAs[i], i, nil
		}
	}
	return nil, -1, fmt.Errorf("hcatest: no HCA %q", ibdev)
}

// IBDevDir is the absolute path of an ibdev's device directory (where
// class/infiniband/<ibdev> points), or "" for an unknown ibdev.
func (n *Node) IBDevDir(ibdev string) string {
	h, _, err := n.hca(ibdev)
	if err != nil {
		return ""
	}
	return filepath.Join(n.SysfsRoot, placeOf(h).ibdev())
}

// PCIDir is the absolute path of an HCA's PCI function directory, or "" for
// a software or unknown ibdev.
func (n *Node) PCIDir(ibdev string) string {
	h, _, err := n.hca(ibdev)
	if err != nil || h.PCI == nil {
		return ""
	}
	return filepath.Join(n.SysfsRoot, placeOf(h).pci)
}

// SetPortState rewrites a port's state and phys_state (full kernel text,
// e.g. "1: DOWN", "3: Disabled"), as when a link goes down.
func (n *Node) SetPortState(ibdev string, port int, state, physState string) error {
	h, _, err := n.hca(ibdev)
	if err != nil {
		return err
	}
	if port < 1 || port > len(h.Ports) {
		return fmt.Errorf("hcatest: HCA %s has no port %d", ibdev, port)
	}
	if !n.ibdevsHidden() {
		w := newWriter(n.SysfsRoot)
		d := fmt.Sprintf("%s/ports/%d", placeOf(h).ibdev(), port)
		w.file(d+"/state", state)
		w.file(d+"/phys_state", physState)
		if w.err != nil {
			return fmt.Errorf("hcatest: %w", w.err)
		}
	}
	h.Ports[port-1].State, h.Ports[port-1].PhysState = state, physState
	return nil
}

// RemoveHCA unregisters an ibdev, as unloading its RDMA driver (mlx5_ib,
// "rdma link delete rxe0") does: its class links, ibdev, uverbs and MAD
// directories and /dev nodes go away; the PCI function and its netdevs stay.
func (n *Node) RemoveHCA(ibdev string) error {
	h, i, err := n.hca(ibdev)
	if err != nil {
		return err
	}
	pl := placeOf(h)
	var sys []string // relative to SysfsRoot
	var dev []string // names under DevRoot/infiniband
	sys = append(sys, "class/infiniband/"+h.Name, pl.ibdev())
	if h.Uverbs >= 0 {
		name := fmt.Sprintf("uverbs%d", h.Uverbs)
		sys = append(sys, "class/infiniband_verbs/"+name, pl.dev("infiniband_verbs", name))
		dev = append(dev, name)
	}
	for _, p := range h.Ports {
		if p.UMAD < 0 {
			continue
		}
		for _, name := range []string{fmt.Sprintf("umad%d", p.UMAD), fmt.Sprintf("issm%d", p.UMAD)} {
			sys = append(sys, "class/infiniband_mad/"+name, pl.dev("infiniband_mad", name))
			dev = append(dev, name)
		}
	}
	for _, rel := range sys {
		path := filepath.Join(n.SysfsRoot, rel)
		if err := os.RemoveAll(path); err != nil {
			return fmt.Errorf("hcatest: %w", err)
		}
		n.dropFaults(path)
	}
	for _, name := range dev {
		if err := os.Remove(filepath.Join(n.DevRoot, "infiniband", name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("hcatest: %w", err)
		}
	}
	// The kernel drops a device's class glue dir once it is empty.
	for _, class := range []string{"infiniband", "infiniband_verbs", "infiniband_mad"} {
		_ = os.Remove(filepath.Join(n.SysfsRoot, filepath.Dir(pl.dev(class, "x"))))
	}
	n.Spec.HCAs = append(n.Spec.HCAs[:i], n.Spec.HCAs[i+1:]...)
	return nil
}

// RenameNetdev renames a netdev, as udev or "ip link set name" does: its
// directory, its class/net link and every GID ndevs entry naming it.
func (n *Node) RenameNetdev(old, new string) error {
	if !validName(new) {
		return fmt.Errorf("hcatest: invalid netdev name %q", new)
	}
	if _, err := os.Lstat(filepath.Join(n.SysfsRoot, "class", "net", new)); err == nil {
		return fmt.Errorf("hcatest: netdev %s already exists", new)
	}
	// The netdev lives under a hardware HCA that owns it, else in
	// devices/virtual/net.
	dir := ""
	for i := range n.Spec.HCAs {
		h := &n.Spec.HCAs[i]
		if contains(h.Netdevs, old) && (dir == "" || h.PCI != nil) {
			dir = placeOf(h).dev("net", old)
		}
	}
	if dir == "" {
		return fmt.Errorf("hcatest: no netdev %q", old)
	}
	newDir := filepath.Join(filepath.Dir(dir), new)
	if err := os.Rename(filepath.Join(n.SysfsRoot, dir), filepath.Join(n.SysfsRoot, newDir)); err != nil {
		return fmt.Errorf("hcatest: %w", err)
	}
	if err := os.Remove(filepath.Join(n.SysfsRoot, "class", "net", old)); err != nil {
		return fmt.Errorf("hcatest: %w", err)
	}
	w := newWriter(n.SysfsRoot)
	w.link("class/net/"+new, newDir)
	if idx, ok := n.ifindex[old]; ok {
		delete(n.ifindex, old)
		n.ifindex[new] = idx
	}
	for i := range n.Spec.HCAs {
		h := &n.Spec.HCAs[i]
		for k, nd := range h.Netdevs {
			if nd == old {
				h.Netdevs[k] = new
			}
		}
		if n.ibdevsHidden() {
			continue
		}
		if len(h.Netdevs) > 0 && h.Netdevs[0] == new && h.PCI == nil && h.NodeType == "1: CA" {
			w.file(placeOf(h).ibdev()+"/parent", new) // rxe prints its netdev's current name
		}
		for pi := range h.Ports {
			p := &h.Ports[pi]
			for gi := range p.GIDs {
				g := &p.GIDs[gi]
				if g.Netdev != old {
					continue
				}
				g.Netdev = new
				if p.LinkLayer == "Ethernet" {
					w.file(fmt.Sprintf("%s/ports/%d/gid_attrs/ndevs/%d", placeOf(h).ibdev(), pi+1, g.Index), new)
				}
			}
		}
	}
	if w.err != nil {
		return fmt.Errorf("hcatest: %w", w.err)
	}
	return nil
}
