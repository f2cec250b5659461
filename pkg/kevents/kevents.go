// Package kevents listens to the kernel's notifications that can change a
// node's RDMA inventory: rtnetlink link messages (a netdev renamed, its
// carrier lost or regained, added or removed), rtnetlink address messages
// (on RoCE every IP address of a port's netdev, or of a VLAN, bond or other
// device stacked on it, is a GID table entry) and kobject uevents of the
// infiniband, infiniband_verbs, net and pci subsystems (a driver reload, a
// VF created, an HCA hot-removed).
//
// An event says "look again", not what changed: the reader rediscovers. The
// kernel drops messages when a socket's buffer overflows; that is reported
// as an Overflow event, so the reader rescans rather than miss a change.
//
// Link and address messages come only for the netdevs of the network
// namespace the socket was opened in (the host's with hostNetwork). An
// address added inside a pod's namespace (to an HCA netdev or VF moved
// there) gives no event here: it is seen at the reader's next poll.
//
// It knows nothing of Kubernetes or of sysfs layout.
package kevents

import (
	"fmt"
	"strings"
)

// Source is the kernel interface an event came from.
type Source string

const (
	// Link is an rtnetlink RTM_NEWLINK or RTM_DELLINK message.
	Link Source = "link"
	// Address is an rtnetlink RTM_NEWADDR or RTM_DELADDR message (IPv4
	// or IPv6).
	Address Source = "address"
	// Uevent is a kobject uevent sent by the kernel.
	Uevent Source = "uevent"
	// Overflow means the kernel dropped messages: anything may have changed.
	Overflow Source = "overflow"
	// Failed means a socket stopped with the error in Err: from now on
	// its changes are seen only by polling.
	Failed Source = "failed"
)

// Event is one notification, with enough detail for a log line.
type Event struct {
	Source Source
	// Action is "newlink"/"dellink" for Link; "newaddr"/"deladdr" for
	// Address; the uevent ACTION ("add", "remove", "change", "move",
	// "bind", "unbind", ...) for Uevent.
	Action string
	// Subsystem is the uevent SUBSYSTEM; "net" for Link and Address.
	Subsystem string
	// Name is the interface name (Link, net uevents, IPv4 Address events:
	// the IFA_LABEL; IPv6 ones carry no name) or the kernel's device name
	// (other uevents, e.g. "mlx5_0", "uverbs3", "0000:0c:00.0").
	Name string
	// Index is the interface index of a Link or Address event.
	Index int32
	// Address is the address with its prefix length ("192.0.2.7/24",
	// "2001:db8::7/64") of an Address event.
	Address string
	// Up is the link's IFF_UP and IFF_LOWER_UP (carrier) for Link events.
	Up, Carrier bool
	// DevPath is the uevent DEVPATH, under /sys.
	DevPath string
	// Err is why a socket failed (Failed).
	Err string
}

func (e Event) String() string {
	switch e.Source {
	case Link:
		return fmt.Sprintf("link %s %s (index %d, up=%t, carrier=%t)", e.Action, e.Name, e.Index, e.Up, e.Carrier)
	case Address:
		if e.Name != "" {
			return fmt.Sprintf("address %s %s on %s (index %d)", e.Action, e.Address, e.Name, e.Index)
		}
		return fmt.Sprintf("address %s %s on index %d", e.Action, e.Address, e.Index)
	case Uevent:
		return fmt.Sprintf("uevent %s %s %s", e.Action, e.Subsystem, e.DevPath)
	case Failed:
		return "failed: " + e.Err
	}
	return string(e.Source)
}

// subsystems whose uevents can change the RDMA inventory.
var subsystems = map[string]bool{"infiniband": true, "infiniband_verbs": true, "net": true, "pci": true}

// ignoredLinkKinds are virtual interfaces that are never an HCA's netdev:
// every pod start creates a veth, and without this a busy node would rescan
// all the time. Bonds are kept: a RoCE LAG's netdev is a bond.
var ignoredLinkKinds = map[string]bool{
	"veth": true, "bridge": true, "vxlan": true, "geneve": true, "tun": true, "dummy": true,
	"macvlan": true, "macvtap": true, "ipvlan": true, "ipvtap": true, "wireguard": true, "vlan": true,
	"ipip": true, "gre": true, "gretap": true, "sit": true, "ip6tnl": true, "vrf": true, "nlmon": true,
}

// stackableKinds can sit on top of an HCA's netdev (its VLAN, a bridge or
// VRF it is enslaved to, a macvlan or ipvlan on it): ib_core turns the
// addresses of the netdev and of every device above it into GIDs. The other
// ignored kinds never carry an HCA's GIDs, so their addresses are ignored
// too (a pod's host-side veth gets an IPv6 link-local address at every pod
// start).
var stackableKinds = map[string]bool{
	"bridge": true, "vrf": true, "vlan": true, "macvlan": true, "macvtap": true, "ipvlan": true, "ipvtap": true,
}

// noGIDKind reports whether addresses on a link of this kind are never GIDs.
func noGIDKind(kind string) bool { return ignoredLinkKinds[kind] && !stackableKinds[kind] }

// relevantUevent keeps the subsystems above, without virtual net devices
// other than bonds (pod veths again).
func relevantUevent(e Event) bool {
	if !subsystems[e.Subsystem] {
		return false
	}
	if e.Subsystem == "net" && strings.HasPrefix(e.DevPath, "/devices/virtual/net/") {
		return strings.HasPrefix(e.Name, "bond")
	}
	return true
}
