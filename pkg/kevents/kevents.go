// Package kevents listens to the kernel's notifications that can change a
// node's RDMA inventory: rtnetlink link messages (a netdev renamed, its
// carrier lost or regained, added or removed) and kobject uevents of the
// infiniband, infiniband_verbs, net and pci subsystems (a driver reload, a
// VF created, an HCA hot-removed).
//
// An event says "look again", not what changed: the reader rediscovers. The
// kernel drops messages when a socket's buffer overflows; that is reported
// as an Overflow event, so the reader rescans rather than miss a change.
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
	// Action is "newlink"/"dellink" for Link; the uevent ACTION ("add",
	// "remove", "change", "move", "bind", "unbind", ...) for Uevent.
	Action string
	// Subsystem is the uevent SUBSYSTEM; "net" for Link.
	Subsystem string
	// Name is the interface name (Link, net uevents) or the kernel's device
	// name (other uevents, e.g. "mlx5_0", "uverbs3", "0000:0c:00.0").
	Name string
	// Index is the interface index of a Link event.
	Index int32
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
