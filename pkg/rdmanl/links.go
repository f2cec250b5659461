package rdmanl

import (
	"fmt"
)

// More rtnetlink numbers (include/uapi/linux/if_link.h).
const (
	iflaLink          = 5  // IFLA_LINK: u32, the lower device (a VLAN's, an IPoIB child's)
	iflaMaster        = 10 // IFLA_MASTER: u32, the bond or bridge it is enslaved to
	iflaLinkNetnsID   = 37 // IFLA_LINK_NETNSID: IFLA_LINK is in another namespace
	iflaParentDevName = 56 // IFLA_PARENT_DEV_NAME: string, the device under it (Linux 6.1 has it)
)

// Link is one netdev as an RTM_GETLINK dump reports it: what tells the
// netdevs of an HCA that RDMA netlink does not name (IPoIB), and the
// devices stacked on one (VLANs, a bond).
type Link struct {
	Index int
	Name  string
	// Parent is the device under it ("0000:17:00.0" for a PCI function);
	// "" for a virtual netdev, or from a kernel that does not say.
	Parent string
	// Lower is the netdev it is stacked on in the same namespace (a VLAN's
	// real device, an IPoIB child's parent), Master the one it is enslaved
	// to; 0 for none.
	Lower, Master int
}

// decodeLink decodes one RTM_NEWLINK answer.
func decodeLink(payload []byte) (Link, error) {
	attrs, err := rtAttrs(payload, ifinfomsgLen, "link")
	if err != nil {
		return Link{}, err
	}
	l := Link{Index: int(int32(ne.Uint32(payload[4:])))}
	otherNetns := false
	for _, a := range attrs {
		var v uint32
		switch a.typ {
		case iflaIfname, iflaParentDevName:
			n := len(a.data)
			if a.nested || n == 0 || a.data[n-1] != 0 {
				return Link{}, fmt.Errorf("link %d: attribute %d: want a NUL-terminated string, got %q", l.Index, a.typ, a.data)
			}
			if a.typ == iflaIfname {
				l.Name = string(a.data[:n-1])
			} else {
				l.Parent = string(a.data[:n-1])
			}
		case iflaLink:
			if v, err = u32Of(a, "IFLA_LINK"); err == nil {
				l.Lower = int(int32(v))
			}
		case iflaMaster:
			if v, err = u32Of(a, "IFLA_MASTER"); err == nil {
				l.Master = int(int32(v))
			}
		case iflaLinkNetnsID:
			otherNetns = true
		}
		if err != nil {
			return Link{}, fmt.Errorf("link %d: %w", l.Index, err)
		}
	}
	if otherNetns {
		l.Lower = 0 // an index of another namespace means nothing here
	}
	if l.Index <= 0 || l.Name == "" {
		return Link{}, fmt.Errorf("link answer without an index or a name (index %d, name %q)", l.Index, l.Name)
	}
	return l, nil
}

// Links lists the netdevs of the socket's namespace, as "ip link" does.
func (r *RouteConn) Links() ([]Link, error) {
	const op = "link dump"
	payloads, err := r.c.exchange(op, rtmNewLink, true, func(seq uint32) []byte { return encodeDump(rtmGetLink, ifinfomsgLen, seq) })
	if err != nil {
		return nil, routeErr(err)
	}
	links := make([]Link, 0, len(payloads))
	for _, p := range payloads {
		l, err := decodeLink(p)
		if err != nil {
			return nil, &Error{Op: op, Err: err, Route: true}
		}
		links = append(links, l)
	}
	return links, nil
}
