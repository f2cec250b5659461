package hca

// Rescans read what can change silently.
//
// A full pass reads about 170 files per HCA: most (firmware, GUIDs, PCI
// topology, NUMA, device numbers, the GID table) change only with something
// the kernel announces: a uevent (a device added, removed, rebound, a
// driver loaded), a link or an address message (a netdev renamed, moved,
// its addresses and so its RoCE GIDs). The daemon receives those
// (pkg/kevents) and calls Invalidate. What changes without a word is a
// port's state, physical state, rate and LIDs, and an InfiniBand port's
// GID prefix (the subnet manager's): those a rescan re-reads, with GID 0 of
// every port as the canary of its table. Everything is read again at least
// every full rescan interval, as a safety net for what the daemon does not
// hear (events off, a pod's network namespace).
//
// A refresh falls back to a full pass whenever it sees anything it does
// not expect: a device listed or gone, a device replaced under its name, the
// netns mode flipped, a GID 0 that differs, or a file it cannot read.

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultFullRescanInterval bounds how stale an unannounced change of what
// a rescan does not re-read can get.
const DefaultFullRescanInterval = 5 * time.Minute

// WithFullRescanInterval makes Discover read everything again at least this
// long after the last full pass; between, it re-reads only what changes
// without a kernel event. Zero or less: every Discover is a full pass.
func WithFullRescanInterval(every time.Duration) Option {
	return func(d *Discoverer) { d.fullEvery = every }
}

// rescanCache is the last full pass and what a refresh checks it against.
type rescanCache struct {
	mu      sync.Mutex
	valid   bool
	at      time.Time
	inv     Inventory
	root    string              // sysfs root, symlinks resolved
	listed  []string            // class/infiniband, sorted
	sysMode NetnsMode           // netns_mode as sysfs had it
	idents  map[string]devIdent // by ibdev
	fulls   int                 // full passes, for tests
}

// devIdent tells a device from another one under the same name.
type devIdent struct{ dev, ino uint64 }

// Invalidate makes the next Discover a full pass: call it on every kernel
// event about RDMA devices, netdevs or addresses.
func (d *Discoverer) Invalidate() {
	d.cache.mu.Lock()
	d.cache.valid = false
	d.cache.mu.Unlock()
}

// FullPasses is how many full passes Discover made.
func (d *Discoverer) FullPasses() int {
	d.cache.mu.Lock()
	defer d.cache.mu.Unlock()
	return d.cache.fulls
}

// Discover returns the node's inventory: a full pass when the last one is
// older than the full rescan interval or was invalidated, else the last
// one with what changes silently read again. It fails only when sysfs
// itself cannot be read; a missing or garbled attribute becomes a warning
// on its HCA, and a node without the RDMA class is an empty inventory.
func (d *Discoverer) Discover() (Inventory, error) {
	if d.fullEvery <= 0 {
		return d.discoverFull()
	}
	c := &d.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.valid && now.Sub(c.at) < d.fullEvery {
		if inv, ok := d.refresh(c); ok {
			c.inv = inv
			return inv.clone(), nil
		}
	}
	inv, err := d.discoverFull()
	c.fulls++
	if err != nil {
		c.valid = false
		return inv, err
	}
	c.valid = d.remember(c, inv)
	c.at, c.inv = now, inv
	return inv.clone(), nil
}

// remember records what a refresh compares against; false when it cannot
// (the next pass is full again).
func (d *Discoverer) remember(c *rescanCache, inv Inventory) bool {
	root, err := filepath.EvalSymlinks(d.sysfsRoot)
	if err != nil {
		return false
	}
	p := newPass(d, root)
	defer p.release()
	var warns []string
	c.root, c.sysMode = root, p.netnsMode(&warns)
	class := p.rootDir(filepath.Join(root, "class", "infiniband"))
	defer p.closeDir(class)
	names, err := p.names(class, "")
	if err != nil || len(warns) > 0 {
		return false
	}
	slices.Sort(names)
	c.listed = names
	c.idents = map[string]devIdent{}
	for _, h := range inv.HCAs {
		id, ok := p.identity(class, h.Name)
		if !ok {
			return false
		}
		c.idents[h.Name] = id
	}
	return true
}

// refresh re-reads what changes silently into a copy of the cached
// inventory; false means a full pass is needed.
func (d *Discoverer) refresh(c *rescanCache) (Inventory, bool) {
	p := newPass(d, c.root)
	defer p.release()
	var warns []string
	if p.netnsMode(&warns) != c.sysMode || len(warns) > 0 {
		return Inventory{}, false
	}
	class := p.rootDir(filepath.Join(c.root, "class", "infiniband"))
	defer p.closeDir(class)
	names, err := p.names(class, "")
	if err != nil {
		return Inventory{}, false
	}
	slices.Sort(names)
	if !slices.Equal(names, c.listed) {
		return Inventory{}, false
	}
	inv := c.inv.clone()
	for i := range inv.HCAs {
		h := &inv.HCAs[i]
		if id, ok := p.identity(class, h.Name); !ok || id != c.idents[h.Name] {
			return Inventory{}, false
		}
		ports := p.openDir(class, h.Name+"/ports")
		ok := true
		for j := range h.Ports {
			pd := p.openDir(ports, strconv.Itoa(h.Ports[j].Number))
			ok = p.refreshPort(pd, &h.Ports[j])
			p.closeDir(pd)
			if !ok {
				break
			}
		}
		p.closeDir(ports)
		if !ok {
			return Inventory{}, false
		}
	}
	return inv, true
}

// refreshPort re-reads a port's state, physical state, rate and LIDs, and
// checks GID 0 against the table read last.
func (p *pass) refreshPort(d dir, port *Port) bool {
	var warns []string
	w := warner{&warns}
	p.readStates(w, d, port)
	p.readRateAndLIDs(w, d, port)
	if len(warns) > 0 {
		return false
	}
	b, err := p.readIn(d, "gids/0")
	if err != nil {
		return false
	}
	gid0 := strings.TrimRight(string(b), "\n")
	had := ""
	if len(port.GIDs) > 0 && port.GIDs[0].Index == 0 {
		had = port.GIDs[0].GID
	}
	if had == "" {
		return isEmptyGID(b)
	}
	return gid0 == had
}

// clone copies inv deeply: callers may change what they get.
func (inv Inventory) clone() Inventory {
	out := inv
	out.HCAs = slices.Clone(inv.HCAs)
	for i, h := range inv.HCAs {
		out.HCAs[i] = h.clone()
	}
	out.RDMACM = clonePtr(inv.RDMACM)
	out.Hidden = slices.Clone(inv.Hidden)
	out.Warnings = slices.Clone(inv.Warnings)
	return out
}

func (h HCA) clone() HCA {
	out := h
	out.Ports = slices.Clone(h.Ports)
	for i := range out.Ports {
		out.Ports[i].GIDs = slices.Clone(out.Ports[i].GIDs)
	}
	out.Uverbs = clonePtr(h.Uverbs)
	out.MAD = slices.Clone(h.MAD)
	out.PCI = clonePtr(h.PCI)
	if h.DataPath != nil {
		dp := *h.DataPath
		dp.GPUs = slices.Clone(dp.GPUs)
		dp.ACS = slices.Clone(dp.ACS)
		out.DataPath = &dp
	}
	out.Netdevs = slices.Clone(h.Netdevs)
	out.Warnings = slices.Clone(h.Warnings)
	return out
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
