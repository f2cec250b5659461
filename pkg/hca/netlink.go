package hca

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// Netlink is what discovery asks the kernel's RDMA netlink: rdmanl.Client
// on a real node, a simulated kernel in tests. Sysfs stays the source of
// everything it has; netlink fills in the netns mode and the ports'
// netdevs (soft-iWARP shows its netdev nowhere else).
type Netlink interface {
	NetnsMode() (rdmanl.NetnsMode, error)
	// Links lists every port of every device of the caller's namespace.
	Links() ([]rdmanl.Port, error)
}

// WithNetlink has discovery ask nl as well as sysfs. nil means sysfs only.
// A failing query is a warning on the inventory, never a failed pass.
func WithNetlink(nl Netlink) Option { return func(d *Discoverer) { d.netlink = nl } }

// HostNetlink is the kernel's RDMA netlink when sysfsRoot is this host's
// sysfs (/sys), and nil for any other tree: a simulated node must not be
// mixed with the host kernel's answers.
func HostNetlink(sysfsRoot string) Netlink {
	if root, err := filepath.EvalSymlinks(sysfsRoot); err != nil || root != "/sys" {
		return nil
	}
	return rdmanl.Client{}
}

// netlinkFacts asks netlink for the netns mode and the ports. Failures
// become warnings; the caller keeps the sysfs values.
func (p *pass) netlinkFacts(inv *Inventory) map[string][]rdmanl.Port {
	nl := p.d.netlink
	if nl == nil {
		return nil
	}
	switch mode, err := nl.NetnsMode(); {
	case err != nil:
		inv.Warnings = append(inv.Warnings, fmt.Sprintf("%v; netns mode from sysfs", err))
	case mode == rdmanl.NetnsShared:
		inv.NetnsMode, inv.NetnsModeSource = NetnsShared, SourceNetlink
	case mode == rdmanl.NetnsExclusive:
		inv.NetnsMode, inv.NetnsModeSource = NetnsExclusive, SourceNetlink
	}
	links, err := nl.Links()
	if err != nil {
		inv.Warnings = append(inv.Warnings, fmt.Sprintf("%v; netdevs from sysfs only", err))
		return nil
	}
	byDev := map[string][]rdmanl.Port{}
	for _, l := range links {
		byDev[l.DevName] = append(byDev[l.DevName], l)
	}
	return byDev
}

// addLinks puts the netdevs netlink reports for h's ports on h: on the
// port, in Netdevs, and as the parent of a software device that sysfs
// gave none.
func addLinks(h *HCA, links []rdmanl.Port) {
	added := false
	for _, l := range links {
		if l.Netdev == "" {
			continue
		}
		for i := range h.Ports {
			if h.Ports[i].Number == int(l.Index) {
				h.Ports[i].Netdev = l.Netdev
			}
		}
		if !slices.Contains(h.Netdevs, l.Netdev) {
			h.Netdevs = append(h.Netdevs, l.Netdev)
			added = true
		}
		if h.Software && h.ParentNetdev == "" {
			h.ParentNetdev = l.Netdev
		}
	}
	if added {
		slices.Sort(h.Netdevs)
	}
}
