// Package hcatest writes a simulated RDMA node under a directory: the sysfs
// tree and the /dev/infiniband nodes, laid out exactly as the Linux kernel
// lays them out (docs/sysfs-layout.md is the contract). Discovery tests and
// the demo run against it instead of real hardware.
//
// The builder knows the layout only; it shares no code with discovery, so a
// misreading of the kernel in one cannot hide the same misreading in the
// other.
package hcatest

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// Spec describes a simulated node.
type Spec struct {
	Hostname    string // node_desc is "<Hostname> <ibdev>"
	NetnsShared bool   // module/ib_core/parameters/netns_mode: "Y" when true, "N" when false
	RDMACMMinor uint32 // misc minor of rdma_cm (e.g. 58); 0 means "no rdma_cm" (module not loaded)
	HCAs        []HCASpec
	// ForeignNetns writes sysfs as a process outside the initial network
	// namespace sees it. In exclusive mode (NetnsShared false) the RDMA
	// devices are not its own: class/infiniband is empty and the ibdev
	// directories are gone, while class/infiniband_verbs and
	// /dev/infiniband still list every device. In shared mode it changes
	// nothing in sysfs (Netlink then reports no port netdevs).
	ForeignNetns bool
}

// HCASpec describes one RDMA device (one ibdev).
type HCASpec struct {
	Name         string     // ibdev, e.g. mlx5_0
	NodeType     string     // "1: CA" when empty; "4: RNIC" for iWARP
	NodeDesc     string     // node_desc; empty => "<Hostname> <ibdev>" (what rdma-ndd writes)
	NodeGUID     string     // a088:c203:0012:3a40
	SysImageGUID string     // shared by the functions of one card
	FWVer        string     // always written (ib_core attribute); empty for drivers without a firmware string
	HCAType      string     // driver attribute: not written when empty (rxe has none)
	BoardID      string     // driver attribute: not written when empty
	Ports        []PortSpec // port N is Ports[N-1]
	PCI          *PCISpec   // nil => software device under devices/virtual
	Uverbs       int        // uverbs index N (dev 231:192+N); -1 => no uverbs device bound
	// Netdevs under <pci>/net/ (hardware); for a software device, its parent
	// netdev, created under devices/virtual/net/ unless a hardware HCA owns it.
	// A software CA (rxe) names it in a parent file; an RNIC (siw) has no
	// sysfs trace of it: only RDMA netlink (Node.Netlink) reports it.
	Netdevs []string
	// Corrupt overwrites files after the tree is written, to feed discovery
	// bad input. Keys are paths relative to the ibdev dir ("ports/1/rate"),
	// or "pci:<path>" relative to the PCI function dir. The value is written
	// followed by "\n"; an empty value removes the file (or link, or dir).
	Corrupt map[string]string
}

// PortSpec describes one port. Empty State, PhysState, LinkLayer and Rate
// default to an active 400G InfiniBand port, so small test specs stay small.
type PortSpec struct {
	State       string    // "4: ACTIVE" etc (full kernel text)
	PhysState   string    // "5: LinkUp"
	LinkLayer   string    // "InfiniBand" | "Ethernet"
	Rate        string    // "400 Gb/sec (4X NDR)"
	LID, SMLID  uint16    // written as hex "0x1a"
	GIDs        []GIDSpec // occupied slots; all other slots up to GIDTableLen are all-zero
	GIDTableLen int       // default 16
	// PKeys is the P_Key table from index 0 ("0xffff", "0x8001"); default
	// "0xffff" alone. An InfiniBand port's table is 128 entries long, the
	// rest 0x0000, as mlx5 has it; other ports have just their entries.
	PKeys []string
	UMAD  int // umad index (dev 231:N, issm 231:64+N); -1 => none
}

// GIDSpec is one occupied GID table slot.
type GIDSpec struct {
	Index  int
	GID    string // written as given: fe80:0000:0000:0000:a088:c203:0012:3a40
	Type   string // "IB/RoCE v1" (default) | "RoCE v2"
	Netdev string // Ethernet only; on InfiniBand ports ndevs/<i> is a fault
}

// PCISpec is the PCI function of a hardware HCA.
type PCISpec struct {
	BusID string // 0000:16:00.0
	// Path holds the elements under devices/, ending in BusID, e.g.
	// {"pci0000:15", "0000:15:01.0", "0000:16:00.0"}; those between the
	// root complex and the function are bridges.
	Path []string

	// IDs without 0x; written with the 0x prefix, not written when empty.
	Vendor, Device, SubsystemVendor, SubsystemDevice string

	Driver   string   // mlx5_core; empty => no driver link
	NUMANode int      // written as-is, -1 allowed
	TotalVFs int      // >0 => PF: writes sriov_totalvfs
	VFs      []string // PF: bus IDs of its VFs => sriov_numvfs=len, virtfnN links
	PF       string   // VF: bus ID of its PF => physfn link
}

// Node is a simulated node written on disk.
type Node struct {
	Root      string // the directory passed to Build, made absolute
	SysfsRoot string // Root/sys
	DevRoot   string // Root/dev
	// Spec as written, defaults filled in; mutations keep it in step.
	Spec Spec
	// Faults maps absolute file paths (under SysfsRoot, symlinks not
	// resolved) to the errno a real kernel returns when reading them
	// (gid_attrs/ndevs/N on InfiniBand ports and on empty slots,
	// gid_attrs/types/N on empty slots: EINVAL). The files exist on disk
	// (empty), as the kernel lists them. Tests may add their own.
	Faults map[string]syscall.Errno
	// CharDevices is true when the /dev nodes are real character devices
	// (Build ran as root); otherwise they are empty regular files.
	CharDevices bool

	realSys string         // SysfsRoot with symlinks resolved, to match Faults
	ifindex map[string]int // netdev name => ifindex
}

const defaultGIDTableLen = 16

// Device numbers, as ib_uverbs, ib_umad and misc allocate them.
const (
	ibMajor           = 231
	uverbsBaseMinor   = 192
	uverbsFixedMinors = 32
	umadFixedMinors   = 64 // issm minors follow the umad ones
	// Beyond the fixed ranges the kernel allocates a dynamic major; these
	// are typical values.
	uverbsDynMajor = 243
	umadDynMajor   = 244
	umadDynMinors  = 1024 - umadFixedMinors
	miscMajor      = 10
)

type devNum struct{ major, minor uint32 }

func (d devNum) String() string { return fmt.Sprintf("%d:%d", d.major, d.minor) }

// mkdev encodes a device number for mknod(2), as glibc makedev and unix.Mkdev do.
func (d devNum) mkdev() int {
	ma, mi := uint64(d.major), uint64(d.minor)
	return int(mi&0xff | (ma&0xfff)<<8 | (mi&^0xff)<<12 | (ma&^0xfff)<<32)
}

func uverbsDev(n int) devNum {
	if n < uverbsFixedMinors {
		return devNum{ibMajor, uint32(uverbsBaseMinor + n)}
	}
	return devNum{uverbsDynMajor, uint32(n - uverbsFixedMinors)}
}

func umadDev(n int) devNum {
	if n < umadFixedMinors {
		return devNum{ibMajor, uint32(n)}
	}
	return devNum{umadDynMajor, uint32(n - umadFixedMinors)}
}

func issmDev(n int) devNum {
	if n < umadFixedMinors {
		return devNum{ibMajor, uint32(umadFixedMinors + n)}
	}
	return devNum{umadDynMajor, uint32(umadDynMinors + n - umadFixedMinors)}
}

// Build writes spec under dir (created if missing) as dir/sys and dir/dev.
// dir/sys must not exist yet. Device nodes are real character devices when
// running as root, empty files otherwise.
func Build(dir string, spec Spec) (*Node, error) {
	return build(dir, spec, os.Geteuid() == 0)
}

func build(dir string, spec Spec, mknod bool) (*Node, error) {
	spec = withDefaults(cloneSpec(spec))
	if err := validate(spec); err != nil {
		return nil, err
	}
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("hcatest: %w", err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("hcatest: %w", err)
	}
	n := &Node{
		Root:        root,
		SysfsRoot:   filepath.Join(root, "sys"),
		DevRoot:     filepath.Join(root, "dev"),
		Spec:        spec,
		Faults:      map[string]syscall.Errno{},
		CharDevices: mknod,
		ifindex:     map[string]int{},
	}
	if _, err := os.Lstat(n.SysfsRoot); err == nil {
		return nil, fmt.Errorf("hcatest: %s already exists", n.SysfsRoot)
	}
	b := &builder{n: n, w: newWriter(n.SysfsRoot), ifindex: 1}
	if err := b.build(); err != nil {
		return nil, fmt.Errorf("hcatest: %w", err)
	}
	if n.realSys, err = filepath.EvalSymlinks(n.SysfsRoot); err != nil {
		return nil, fmt.Errorf("hcatest: %w", err)
	}
	return n, nil
}

// withDefaults fills the documented defaults in, so Node.Spec says what is
// on disk.
func withDefaults(s Spec) Spec {
	for i := range s.HCAs {
		h := &s.HCAs[i]
		if h.NodeType == "" {
			h.NodeType = "1: CA"
		}
		for j := range h.Ports {
			p := &h.Ports[j]
			p.State = cmpOr(p.State, "4: ACTIVE")
			p.PhysState = cmpOr(p.PhysState, "5: LinkUp")
			p.LinkLayer = cmpOr(p.LinkLayer, "InfiniBand")
			p.Rate = cmpOr(p.Rate, "400 Gb/sec (4X NDR)")
			if p.GIDTableLen == 0 {
				p.GIDTableLen = defaultGIDTableLen
			}
			for k := range p.GIDs {
				p.GIDs[k].Type = cmpOr(p.GIDs[k].Type, "IB/RoCE v1")
			}
		}
	}
	return s
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func cloneSpec(s Spec) Spec {
	hcas := make([]HCASpec, len(s.HCAs))
	for i, h := range s.HCAs {
		h.Ports = append([]PortSpec(nil), h.Ports...)
		for j := range h.Ports {
			h.Ports[j].GIDs = append([]GIDSpec(nil), h.Ports[j].GIDs...)
		}
		h.Netdevs = append([]string(nil), h.Netdevs...)
		if h.Corrupt != nil {
			c := make(map[string]string, len(h.Corrupt))
			for k, v := range h.Corrupt {
				c[k] = v
			}
			h.Corrupt = c
		}
		if h.PCI != nil {
			p := *h.PCI
			p.Path = append([]string(nil), p.Path...)
			p.VFs = append([]string(nil), p.VFs...)
			h.PCI = &p
		}
		hcas[i] = h
	}
	s.HCAs = hcas
	return s
}

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

// writer writes sysfs files relative to root and keeps the first error.
type writer struct {
	root string
	dirs map[string]bool
	err  error
}

func newWriter(root string) *writer { return &writer{root: root, dirs: map[string]bool{}} }

func (w *writer) dir(rel string) {
	if w.err != nil || w.dirs[rel] {
		return
	}
	if err := os.MkdirAll(filepath.Join(w.root, rel), 0o755); err != nil {
		w.err = err
		return
	}
	for d := rel; d != "." && d != "/" && !w.dirs[d]; d = filepath.Dir(d) {
		w.dirs[d] = true
	}
}

// file writes content plus the newline sysfs ends every attribute with.
func (w *writer) file(rel, content string) {
	w.dir(filepath.Dir(rel))
	if w.err == nil {
		w.err = os.WriteFile(filepath.Join(w.root, rel), []byte(content+"\n"), 0o644)
	}
}

// empty writes an empty file: an attribute whose read fails.
func (w *writer) empty(rel string) {
	w.dir(filepath.Dir(rel))
	if w.err == nil {
		w.err = os.WriteFile(filepath.Join(w.root, rel), nil, 0o644)
	}
}

// link makes rel a relative symlink to target (both relative to root), as
// the kernel spells it: up to an ancestor of the target's parent, then down,
// so a link to an ancestor still names it (device -> ../../../0000:16:00.0).
func (w *writer) link(rel, target string) {
	dir := filepath.Dir(rel)
	w.dir(dir)
	if w.err != nil {
		return
	}
	up, err := filepath.Rel(dir, filepath.Dir(target))
	if err != nil {
		w.err = err
		return
	}
	w.err = os.Symlink(filepath.Join(up, filepath.Base(target)), filepath.Join(w.root, rel))
}

type builder struct {
	n       *Node
	w       *writer
	ifindex int
	written map[string]bool // netdevs and bridges already written
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

// netdev writes a netdev under the HCA's PCI function (or devices/virtual)
// and its class/net link. A software parent shared by several software
// HCAs is written once.
func (b *builder) netdev(pl place, name, address, typ string) {
	d := pl.dev("net", name)
	if b.written[d] {
		return
	}
	b.written[d] = true
	w := b.w
	w.file(d+"/ifindex", fmt.Sprint(b.ifindex))
	b.n.ifindex[name] = b.ifindex
	b.ifindex++
	w.file(d+"/address", address)
	w.file(d+"/type", typ)
	if pl.pci != "" {
		w.link(d+"/device", pl.pci)
	}
	w.link("class/net/"+name, d)
}

// netdevAddress derives a netdev's hardware address from the node GUID, as
// mlx5 and rxe relate them: a MAC with 03:00 (mlx5) or ff:fe (EUI-64, U/L
// bit flipped) inserted, or for IPoIB the QPN followed by the port GID.
func netdevAddress(guid string, k int, ethernet bool) string {
	g, _ := hex.DecodeString(strings.ReplaceAll(guid, ":", ""))
	if len(g) != 8 {
		g = make([]byte, 8)
	}
	var a []byte
	if ethernet {
		a = []byte{g[0], g[1], g[2], g[5], g[6], g[7] + byte(k)}
		if g[3] == 0xff && g[4] == 0xfe {
			a[0] ^= 0x02
		}
	} else {
		a = append([]byte{0x00, 0x00, 0x10, 0x29 + byte(k), 0xfe, 0x80, 0, 0, 0, 0, 0, 0}, g...)
	}
	parts := make([]string, len(a))
	for i, c := range a {
		parts[i] = fmt.Sprintf("%02x", c)
	}
	return strings.Join(parts, ":")
}

// charDev makes /dev/infiniband/<name>: a character device as root, an
// empty file otherwise.
func (b *builder) charDev(name string, dn devNum) error {
	path := filepath.Join(b.n.DevRoot, "infiniband", name)
	if !b.n.CharDevices {
		return os.WriteFile(path, nil, 0o666)
	}
	if err := syscall.Mknod(path, syscall.S_IFCHR|0o666, dn.mkdev()); err != nil {
		return &fs.PathError{Op: "mknod", Path: path, Err: err}
	}
	return os.Chmod(path, 0o666) // undo the umask, as udev does
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
