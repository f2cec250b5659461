package hca

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Discoverer reads an RDMA inventory from a sysfs tree and a dev tree. A
// discovery holds no state between passes; PortStates keeps the port state
// files open (closed when the Discoverer is collected). One value may be
// reused and shared.
type Discoverer struct {
	sysfsRoot string
	devRoot   string
	readFile  func(string) ([]byte, error)
	hooked    bool // readFile came from WithReadFile: every read goes through it
	netlink   Netlink
	watch     *portWatch // PortStates' open files
}

// Option configures a Discoverer.
type Option func(*Discoverer)

// WithSysfsRoot reads sysfs from root instead of /sys (a container's
// host mount, or a simulated node).
func WithSysfsRoot(root string) Option { return func(d *Discoverer) { d.sysfsRoot = root } }

// WithDevRoot looks for device nodes under root instead of /dev.
func WithDevRoot(root string) Option { return func(d *Discoverer) { d.devRoot = root } }

// WithReadFile replaces os.ReadFile for sysfs attribute files, so a test can
// make reads fail the way the kernel does (EINVAL on some GID attributes).
// f may be called from several goroutines at once.
func WithReadFile(f func(string) ([]byte, error)) Option {
	return func(d *Discoverer) { d.readFile, d.hooked = f, true }
}

// NewDiscoverer returns a Discoverer for /sys and /dev unless told otherwise.
func NewDiscoverer(opts ...Option) *Discoverer {
	d := &Discoverer{sysfsRoot: "/sys", devRoot: "/dev", readFile: readSysfs}
	for _, o := range opts {
		o(d)
	}
	if w := newPortWatch(); w != nil {
		d.watch = w
		runtime.AddCleanup(d, func(w *portWatch) { w.close() }, w)
	}
	return d
}

// Discover is NewDiscoverer(opts...).Discover().
func Discover(opts ...Option) (Inventory, error) { return NewDiscoverer(opts...).Discover() }

// Discover walks the tree once. It fails only when sysfs itself cannot be
// read; a missing or garbled attribute becomes a warning on its HCA, and a
// node without the RDMA class is an empty inventory.
func (d *Discoverer) Discover() (Inventory, error) {
	var inv Inventory
	root, err := filepath.EvalSymlinks(d.sysfsRoot)
	if err != nil {
		return inv, fmt.Errorf("sysfs root %s: %w", d.sysfsRoot, err)
	}
	walk := newPass(d, root)
	defer walk.done()

	inv.NetnsMode = walk.netnsMode(&inv.Warnings)
	if inv.NetnsMode != NetnsUnknown {
		inv.NetnsModeSource = SourceSysfs
	}
	inv.RDMACM = walk.rdmaCM(&inv.Warnings)

	ibClass := filepath.Join(root, "class", "infiniband")
	entries, err := walk.names(dir{fd: -1, path: ibClass}, "")
	if errors.Is(err, fs.ErrNotExist) {
		return inv, nil // no ib_core: nothing to ask netlink either
	}
	if err != nil {
		return inv, fmt.Errorf("listing RDMA devices: %w", err)
	}
	slices.Sort(entries)
	walk.ibClass = walk.rootDir(ibClass)
	links := walk.netlinkFacts(&inv)
	var (
		uverbs                map[string]CharDevice
		badUverbs             map[string]string
		uverbsWarns, madWarns []string
		mads                  map[string][]CharDevice
	)
	hcas := make([]HCA, len(entries))
	walk.parallel(2+len(entries), func(p *pass, i int) {
		switch i {
		case 0:
			uverbs, badUverbs, uverbsWarns = p.uverbsDevices()
		case 1:
			mads, madWarns = p.madDevices()
		default:
			hcas[i-2] = p.hca(entries[i-2])
		}
	})
	inv.Warnings = append(inv.Warnings, uverbsWarns...)
	inv.Warnings = append(inv.Warnings, madWarns...)

	for _, h := range hcas {
		addLinks(&h, links[h.Name])
		badReason := ""
		if u, ok := uverbs[h.Name]; ok {
			h.Uverbs = &u
		} else if r, ok := badUverbs[h.Name]; ok {
			badReason = r
			delete(badUverbs, h.Name)
		}
		h.MAD = mads[h.Name]
		walk.judge(&h, badReason)
		inv.HCAs = append(inv.HCAs, h)
	}
	// A bad verbs device of an ibdev that is not there (or that has a good
	// one too) is nobody's UnusableReason: say it on the node.
	orphans := make([]string, 0, len(badUverbs))
	for _, r := range badUverbs {
		orphans = append(orphans, r)
	}
	slices.Sort(orphans)
	inv.Warnings = append(inv.Warnings, orphans...)
	var w string
	if inv.Hidden, w = hiddenDevices(entries, uverbs, inv.NetnsMode); w != "" {
		inv.Warnings = append(inv.Warnings, w)
	}
	slices.SortFunc(inv.HCAs, func(a, b HCA) int { return strings.Compare(a.Name, b.Name) })
	return inv, nil
}

// hiddenDevices says when class/infiniband_verbs names ibdevs that
// class/infiniband does not list. In exclusive netns mode that is what
// sysfs shows a process outside the devices' network namespace.
func hiddenDevices(entries []string, uverbs map[string]CharDevice, mode NetnsMode) ([]string, string) {
	listed := make(map[string]bool, len(entries))
	for _, e := range entries {
		listed[e] = true
	}
	var hidden []string
	for ibdev := range uverbs {
		if !listed[ibdev] {
			hidden = append(hidden, ibdev)
		}
	}
	if len(hidden) == 0 {
		return nil, ""
	}
	slices.Sort(hidden)
	w := fmt.Sprintf("class/infiniband does not list %s, which class/infiniband_verbs names", strings.Join(hidden, ", "))
	if mode == NetnsExclusive {
		w += ": in exclusive netns mode sysfs shows only the RDMA devices of the reader's network namespace; run in the host's (hostNetwork)"
	}
	return hidden, w
}

// pass is one discovery walk.
type pass struct {
	d       *Discoverer
	root    string // sysfs root, symlinks resolved
	ibClass dir    // class/infiniband
	buf     []byte // every file read of the pass lands here
	dents   []byte // directory entries
}

// dir is a directory a pass reads: on Linux fd is open and its files are
// opened relative to it (openat); fd is -1 when it is read by path.
type dir struct {
	fd   int
	path string // for messages, and reads by path
}

func (d dir) join(name string) string {
	if name == "" {
		return d.path
	}
	if d.path == "" {
		return name
	}
	return d.path + string(filepath.Separator) + name
}

type passBufs struct{ buf, dents []byte }

// bufPool keeps the buffers between passes: a rescan allocates none.
var bufPool = sync.Pool{New: func() any {
	return &passBufs{buf: make([]byte, 0, 4096), dents: make([]byte, 32<<10)}
}}

func newPass(d *Discoverer, root string) *pass {
	b := bufPool.Get().(*passBufs)
	return &pass{d: d, root: root, ibClass: dir{fd: -1}, buf: b.buf, dents: b.dents}
}

func (p *pass) done() {
	p.closeDir(p.ibClass)
	p.release()
}

func (p *pass) release() { bufPool.Put(&passBufs{buf: p.buf[:0], dents: p.dents}) }

// maxWorkers bounds the goroutines of one pass: sysfs reads are system
// calls, so more workers than CPUs only queue.
const maxWorkers = 4

// parallel runs f(i) for i in [0, n) on up to GOMAXPROCS workers, each
// with its own pass buffers. The HCAs of a node are independent.
func (p *pass) parallel(n int, f func(p *pass, i int)) {
	workers := min(runtime.GOMAXPROCS(0), maxWorkers, n)
	var next atomic.Int64
	work := func(sub *pass) {
		for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
			f(sub, i)
		}
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		sub := newPass(p.d, p.root)
		sub.ibClass = p.ibClass
		wg.Go(func() {
			defer sub.release()
			work(sub)
		})
	}
	work(p)
	wg.Wait()
}

// read returns a file's content without the trailing newline.
func (p *pass) read(path string) (string, error) {
	b, err := p.d.readFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// readAt is read for name in d.
func (p *pass) readAt(d dir, name string) (string, error) {
	b, err := p.readIn(d, name)
	if err != nil {
		return "", err
	}
	for len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	}
	return string(b), nil
}

// warner collects warnings that name the file.
type warner struct{ list *[]string }

func (w warner) add(path string, err error) { *w.list = append(*w.list, fileError(path, err)) }

// fileError is "<path>: <err>", without repeating the path a PathError
// already carries.
func fileError(path string, err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == path {
		err = pe.Err
	}
	return fmt.Sprintf("%s: %v", path, err)
}

// addErr records an error that already names its file.
func (w warner) addErr(err error) { *w.list = append(*w.list, err.Error()) }

// readAttr reads a required attribute, name in d; a failure is a warning.
func (p *pass) readAttr(w warner, d dir, name string) (string, bool) {
	s, err := p.readAt(d, name)
	if err != nil {
		w.add(d.join(name), err)
		return "", false
	}
	return s, true
}

// readOptional reads an attribute that some drivers lack: absence is silent.
func (p *pass) readOptional(w warner, d dir, name string) string {
	s, err := p.readAt(d, name)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		w.add(d.join(name), err)
	}
	return s
}

func (p *pass) netnsMode(warns *[]string) NetnsMode {
	path := filepath.Join(p.root, "module", "ib_core", "parameters", "netns_mode")
	s, err := p.read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return NetnsUnknown
	}
	w := warner{warns}
	if err != nil {
		w.add(path, err)
		return NetnsUnknown
	}
	m, err := parseNetnsMode(s)
	if err != nil {
		w.add(path, err)
	}
	return m
}

func (p *pass) rdmaCM(warns *[]string) *CharDevice {
	path := filepath.Join(p.root, "class", "misc", "rdma_cm", "dev")
	s, err := p.read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	w := warner{warns}
	if err != nil {
		w.add(path, err)
		return nil
	}
	cd, err := p.charDevice("rdma_cm", path, s)
	if err != nil {
		// Every container that gets rdma_cm would get the bad node: leave
		// it out, as when rdma_ucm is not loaded, and say so.
		w.addErr(fmt.Errorf("%w; rdma_cm is left out of the inventory", err))
		return nil
	}
	return &cd
}

// charDevice builds a CharDevice from its sysfs dev file (path, holding
// dev) and looks for its node under the dev root. It fails, naming the file
// at fault, when dev is not a device number the kernel allocates, or when the
// node is there but is not a character device of that number. A node that
// is missing is not an error here (Exists is false), nor is a regular file:
// that is what a simulated node has when it was built without root, and a
// container's node is made from the sysfs number, never copied from /dev.
func (p *pass) charDevice(name, path, dev string) (CharDevice, error) {
	major, minor, err := parseDevNumbers(dev)
	if err != nil {
		return CharDevice{}, fmt.Errorf("%s: %w", path, err)
	}
	cd := CharDevice{Name: name, Path: "/dev/infiniband/" + name, Major: major, Minor: minor}
	node := filepath.Join(p.d.devRoot, "infiniband", name)
	fi, err := os.Stat(node)
	if err != nil {
		return cd, nil
	}
	cd.Exists = true
	switch mode := fi.Mode(); {
	case mode.IsRegular():
	case mode.Type() != fs.ModeDevice|fs.ModeCharDevice:
		return CharDevice{}, fmt.Errorf("%s is not a character device (mode %v)", node, mode)
	default:
		if ma, mi, ok := nodeNumber(fi); ok && (ma != major || mi != minor) {
			return CharDevice{}, fmt.Errorf("%s is character device %d:%d, but %s says %q", node, ma, mi, path, dev)
		}
	}
	return cd, nil
}

// classDevices lists the entries of a class, sorted. The class dir is open
// while the caller reads them, and closed by the caller.
func (p *pass) classDevices(class string) (dir, []string, error) {
	cd := p.rootDir(filepath.Join(p.root, "class", class))
	entries, err := p.names(cd, "")
	if errors.Is(err, fs.ErrNotExist) {
		return cd, nil, nil
	}
	if err != nil {
		return cd, nil, err
	}
	slices.Sort(entries)
	return cd, entries, nil
}

// classDevice opens a class entry, or says it is no device directory (a
// plain file such as abi_version, or a dangling link).
func (p *pass) classDevice(class dir, name string) (dir, bool) {
	d, err := p.openDirErr(class, name)
	if d.fd >= 0 {
		return d, true
	}
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ENOENT) {
		return d, false
	}
	return d, p.isDirIn(class, name) // read by path: errors name the files
}

// uverbsDevices maps ibdev name to its verbs device. A verbs device whose
// dev file is unreadable or impossible, or whose /dev node contradicts it,
// is left out of good; bad then says why, by ibdev, naming the file, to
// become the HCA's UnusableReason.
func (p *pass) uverbsDevices() (good map[string]CharDevice, bad map[string]string, warns []string) {
	w := warner{&warns}
	class, names, err := p.classDevices("infiniband_verbs")
	defer p.closeDir(class)
	if err != nil {
		w.add(class.path, err)
	}
	good, bad = map[string]CharDevice{}, map[string]string{}
	for _, name := range names {
		d, ok := p.classDevice(class, name)
		if !ok {
			continue
		}
		p.uverbsDevice(w, d, name, good, bad)
		p.closeDir(d)
	}
	return good, bad, warns
}

func (p *pass) uverbsDevice(w warner, d dir, name string, good map[string]CharDevice, bad map[string]string) {
	ibdev, ok := p.readAttr(w, d, "ibdev")
	if !ok {
		return
	}
	devPath := d.join("dev")
	dev, err := p.readAt(d, "dev")
	if err != nil {
		bad[ibdev] = fileError(devPath, err)
		return
	}
	cd, err := p.charDevice(name, devPath, dev)
	if err != nil {
		bad[ibdev] = err.Error()
		return
	}
	good[ibdev] = cd
}

// madDevices maps ibdev name to its umad and issm devices, sorted by name.
func (p *pass) madDevices() (map[string][]CharDevice, []string) {
	var warns []string
	w := warner{&warns}
	class, names, err := p.classDevices("infiniband_mad")
	defer p.closeDir(class)
	if err != nil {
		w.add(class.path, err)
	}
	out := map[string][]CharDevice{}
	for _, name := range names {
		d, ok := p.classDevice(class, name)
		if !ok {
			continue
		}
		ibdev, ok1 := p.readAttr(w, d, "ibdev")
		port, ok2 := p.readAttr(w, d, "port")
		dev, ok3 := p.readAttr(w, d, "dev")
		p.closeDir(d)
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 {
			w.add(d.join("port"), fmt.Errorf("cannot parse %q: want a port number", port))
			continue
		}
		cd, err := p.charDevice(name, d.join("dev"), dev)
		if err != nil {
			w.addErr(err)
			continue
		}
		cd.Port = n
		out[ibdev] = append(out[ibdev], cd)
	}
	for _, l := range out {
		slices.SortFunc(l, func(a, b CharDevice) int { return strings.Compare(a.Name, b.Name) })
	}
	return out, warns
}

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

func (p *pass) ports(w warner, ib dir) []Port {
	d := p.openDir(ib, "ports")
	defer p.closeDir(d)
	names, err := p.names(d, "")
	if err != nil {
		w.add(d.path, err)
		return nil
	}
	var ports []Port
	for _, name := range names {
		n, err := strconv.Atoi(name)
		if err != nil || n < 1 {
			continue
		}
		pd := p.openDir(d, name)
		ports = append(ports, p.port(w, pd, n))
		p.closeDir(pd)
	}
	slices.SortFunc(ports, func(a, b Port) int { return a.Number - b.Number })
	return ports
}

func (p *pass) port(w warner, dir dir, n int) Port {
	port := Port{Number: n, RoCEv2GIDIndex: -1}
	word := func(file string) string {
		s, ok := p.readAttr(w, dir, file)
		if !ok {
			return ""
		}
		_, v, err := parseNumberedWord(s)
		if err != nil {
			w.add(dir.join(file), err)
		}
		return v
	}
	port.State = word("state")
	port.PhysState = word("phys_state")

	if s, ok := p.readAttr(w, dir, "link_layer"); ok {
		switch LinkLayer(s) {
		case LinkLayerInfiniBand, LinkLayerEthernet:
			port.LinkLayer = LinkLayer(s)
		default:
			w.add(dir.join("link_layer"), fmt.Errorf("unknown link layer %q: want InfiniBand or Ethernet", s))
		}
	}
	if s, ok := p.readAttr(w, dir, "rate"); ok {
		if r, err := parseRate(s); err != nil {
			w.add(dir.join("rate"), err)
		} else {
			port.RateGbps, port.Width, port.Speed = r.gbps, r.width, r.speed
		}
	}
	if port.LinkLayer == LinkLayerInfiniBand {
		for _, f := range []struct {
			file string
			dst  *int
		}{{"lid", &port.LID}, {"sm_lid", &port.SMLID}} {
			if s, ok := p.readAttr(w, dir, f.file); ok {
				if v, err := parseHexInt(s, 16); err != nil {
					w.add(dir.join(f.file), err)
				} else {
					*f.dst = int(v)
				}
			}
		}
	}
	port.GIDs = p.gids(w, dir, port.LinkLayer == LinkLayerEthernet)
	port.RoCEv2GIDIndex = roceV2Index(port.GIDs)
	return port
}

// gids reads the occupied slots of a port's GID table. Empty slots are
// skipped before their attributes are read (those reads fail by design).
// Every slot is read: the kernel does not keep the table compact.
func (p *pass) gids(w warner, port dir, ethernet bool) []GID {
	gids := p.openDir(port, "gids")
	defer p.closeDir(gids)
	names, err := p.names(gids, "")
	if err != nil {
		w.add(gids.path, err)
		return nil
	}
	var out []GID
	for _, name := range names {
		idx, err := strconv.Atoi(name)
		if err != nil || idx < 0 {
			continue
		}
		b, err := p.readIn(gids, name)
		if err != nil {
			w.add(gids.join(name), err)
			continue
		}
		// Most slots are empty (rxe has 1024): skip them before any
		// parsing or allocation.
		if isEmptyGID(b) {
			continue
		}
		s := strings.TrimRight(string(b), "\n")
		if _, empty, err := parseGID(s); err != nil {
			w.add(gids.join(name), err)
			continue
		} else if empty {
			continue
		}
		g := GID{Index: idx, GID: s}
		g.Type = p.gidAttr(w, port, "gid_attrs/types/"+name)
		if ethernet {
			g.Netdev = p.gidAttr(w, port, "gid_attrs/ndevs/"+name)
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b GID) int { return a.Index - b.Index })
	return out
}

// emptyGID is an unused GID table slot as sysfs prints it.
const emptyGID = "0000:0000:0000:0000:0000:0000:0000:0000\n"

func isEmptyGID(b []byte) bool { return string(b) == emptyGID }

// dirNames lists a directory's names, unsorted (callers sort what they keep).
func dirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: err}
	}
	return names, nil
}

// gidAttr reads a GID attribute. EINVAL and ENODATA are the kernel's way of
// saying "no value" (no netdev on InfiniBand, a slot being torn down), so
// they are silent.
func (p *pass) gidAttr(w warner, port dir, name string) string {
	s, err := p.readAt(port, name)
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENODATA) || errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	if err != nil {
		w.add(port.join(name), err)
		return ""
	}
	return s
}

// roceV2Index picks the RoCE v2 GID that carries an IP address: the lowest
// IPv4-mapped one, else the lowest global IPv6 one, else -1.
func roceV2Index(gids []GID) int {
	v6 := -1
	for _, g := range gids {
		if g.Type != "RoCE v2" {
			continue
		}
		a, _, err := parseGID(g.GID)
		if err != nil {
			continue
		}
		if a.Is4In6() {
			return g.Index
		}
		if v6 < 0 && !a.IsLinkLocalUnicast() {
			v6 = g.Index
		}
	}
	return v6
}

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

// judge decides whether an HCA can be handed to a container. badUverbs is
// why its verbs device was rejected, if it was.
func (p *pass) judge(h *HCA, badUverbs string) {
	switch {
	case h.Uverbs == nil && badUverbs != "":
		h.UnusableReason = badUverbs
	case h.Uverbs == nil:
		h.UnusableReason = "no uverbs device is bound to it (is ib_uverbs loaded?)"
	case !h.Uverbs.Exists:
		h.UnusableReason = fmt.Sprintf("%s is missing under %s", h.Uverbs.Path, p.d.devRoot)
	case len(h.Ports) == 0:
		h.UnusableReason = "it has no ports"
	default:
		h.Usable = true
	}
}
