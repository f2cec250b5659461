package hca

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Discoverer reads an RDMA inventory from a sysfs tree and a dev tree. It
// keeps the last full discovery and, until Invalidate or the full rescan
// interval, re-reads only what changes without a kernel event (see
// rescan.go); PortStates keeps the port state files open (closed when the
// Discoverer is collected). One value may be reused and shared.
type Discoverer struct {
	fullEvery time.Duration // see WithFullRescanInterval
	cache     rescanCache
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
	d := &Discoverer{sysfsRoot: "/sys", devRoot: "/dev", readFile: readSysfs, fullEvery: DefaultFullRescanInterval}
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

// discoverFull walks the tree once. It fails only when sysfs itself cannot
// be read; a missing or garbled attribute becomes a warning on its HCA, and
// a node without the RDMA class is an empty inventory.
func (d *Discoverer) discoverFull() (Inventory, error) {
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
	walk.dataPaths(&inv)
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
