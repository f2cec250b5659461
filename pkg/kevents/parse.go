package kevents

// Parsers of the two wire formats. They take untrusted bytes: a short or
// garbled message is an error, never a panic (fuzzed).

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
)

// rtnetlink constants (linux/netlink.h, linux/rtnetlink.h, linux/if_link.h,
// linux/if_addr.h, linux/socket.h).
const (
	nlmsgHdrLen   = 16
	ifinfomsgLen  = 16
	nlmsgDone     = 3
	rtmNewLink    = 16
	rtmDelLink    = 17
	iflaIfname    = 3
	iflaLinkinfo  = 18
	iflaInfoKind  = 1
	iffUp         = 0x1
	iffLowerUp    = 0x10000
	rtaAlignBytes = 4

	rtmNewAddr   = 20
	rtmDelAddr   = 21
	ifaddrmsgLen = 8
	ifaAddress   = 1
	ifaLocal     = 2
	ifaLabel     = 3
	afInet       = 2
	afInet6      = 10
)

// ParseUevent reads one kernel uevent datagram: "ACTION@DEVPATH\0" then
// "KEY=VALUE\0" pairs. ok is false for a message it should not act on
// (another subsystem, a virtual netdev, a libudev message).
func ParseUevent(b []byte) (ev Event, ok bool, err error) {
	fields := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
	if len(fields) == 0 || len(fields[0]) == 0 {
		return Event{}, false, fmt.Errorf("uevent: empty message")
	}
	head := string(fields[0])
	if head == "libudev" {
		return Event{}, false, nil // udevd's re-broadcast, not the kernel's
	}
	action, devpath, found := strings.Cut(head, "@")
	if !found || action == "" || devpath == "" {
		return Event{}, false, fmt.Errorf("uevent: header %q is not ACTION@DEVPATH", truncate(head))
	}
	ev = Event{Source: Uevent, Action: action, DevPath: devpath}
	for _, f := range fields[1:] {
		k, v, found := strings.Cut(string(f), "=")
		if !found {
			continue
		}
		switch k {
		case "ACTION":
			ev.Action = v
		case "DEVPATH":
			ev.DevPath = v
		case "SUBSYSTEM":
			ev.Subsystem = v
		case "INTERFACE", "NAME":
			ev.Name = v
		}
	}
	if ev.Name == "" {
		ev.Name = ev.DevPath[strings.LastIndexByte(ev.DevPath, '/')+1:]
	}
	return ev, relevantUevent(ev), nil
}

// ParseRoute reads the rtnetlink messages of one datagram and returns the
// link events among them, without the virtual interfaces that are never an
// HCA's netdev, and the IPv4 and IPv6 address events. It keeps no state:
// the Watcher also drops addresses on interfaces it has seen to be of a
// kind that never carries a GID (routeFilter).
func ParseRoute(b []byte) ([]Event, error) {
	var out []Event
	err := eachRoute(b, func(m routeMsg) {
		if m.ev.Source == Link && ignoredLinkKinds[m.kind] {
			return
		}
		out = append(out, m.ev)
	})
	return out, err
}

// routeMsg is one link or address message.
type routeMsg struct {
	ev   Event
	kind string // IFLA_INFO_KIND of a link; "" for a physical netdev
	// seq and pid of the nlmsghdr: a reply to our own request carries
	// ours, a notification those of whoever made the change.
	seq, pid uint32
}

// eachRoute calls f for each link and address message of a datagram, up
// to NLMSG_DONE or the first malformed message.
func eachRoute(b []byte, f func(routeMsg)) error {
	for len(b) > 0 {
		if len(b) < nlmsgHdrLen {
			return fmt.Errorf("rtnetlink: %d trailing bytes, shorter than a message header", len(b))
		}
		n := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		if n < nlmsgHdrLen || n > len(b) {
			return fmt.Errorf("rtnetlink: message length %d outside 16..%d", n, len(b))
		}
		m := routeMsg{seq: binary.NativeEndian.Uint32(b[8:12]), pid: binary.NativeEndian.Uint32(b[12:16])}
		msg := b[nlmsgHdrLen:n]
		if adv := align(n); adv < len(b) {
			b = b[adv:]
		} else {
			b = nil
		}
		var err error
		keep := true
		switch typ {
		case nlmsgDone:
			return nil
		case rtmNewLink, rtmDelLink:
			m.ev, m.kind, err = parseIfinfo(typ, msg)
		case rtmNewAddr, rtmDelAddr:
			m.ev, keep, err = parseIfaddr(typ, msg)
		default:
			continue
		}
		if err != nil {
			return err
		}
		if keep {
			f(m)
		}
	}
	return nil
}

func parseIfinfo(typ uint16, msg []byte) (ev Event, kind string, err error) {
	if len(msg) < ifinfomsgLen {
		return Event{}, "", fmt.Errorf("rtnetlink: link message of %d bytes, shorter than ifinfomsg", len(msg))
	}
	flags := binary.NativeEndian.Uint32(msg[8:12])
	ev = Event{Source: Link, Action: "newlink", Subsystem: "net",
		Index: int32(binary.NativeEndian.Uint32(msg[4:8])), Up: flags&iffUp != 0, Carrier: flags&iffLowerUp != 0}
	if typ == rtmDelLink {
		ev.Action = "dellink"
	}
	err = walkAttrs(msg[ifinfomsgLen:], func(t uint16, v []byte) error {
		switch t {
		case iflaIfname:
			ev.Name = cString(v)
		case iflaLinkinfo:
			return walkAttrs(v, func(t uint16, v []byte) error {
				if t == iflaInfoKind {
					kind = cString(v)
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return Event{}, "", fmt.Errorf("rtnetlink: link %d: %w", ev.Index, err)
	}
	return ev, kind, nil
}

// parseIfaddr reads an ifaddrmsg and its attributes. keep is false for a
// family other than IPv4 and IPv6, which never makes a GID.
func parseIfaddr(typ uint16, msg []byte) (ev Event, keep bool, err error) {
	if len(msg) < ifaddrmsgLen {
		return Event{}, false, fmt.Errorf("rtnetlink: address message of %d bytes, shorter than ifaddrmsg", len(msg))
	}
	family, plen := msg[0], int(msg[1])
	ev = Event{Source: Address, Action: "newaddr", Subsystem: "net", Index: int32(binary.NativeEndian.Uint32(msg[4:8]))}
	if typ == rtmDelAddr {
		ev.Action = "deladdr"
	}
	size := 0
	switch family {
	case afInet:
		size = 4
	case afInet6:
		size = 16
	default:
		return Event{}, false, nil
	}
	var address, local []byte
	err = walkAttrs(msg[ifaddrmsgLen:], func(t uint16, v []byte) error {
		switch t {
		case ifaAddress:
			address = v
		case ifaLocal:
			local = v
		case ifaLabel:
			ev.Name = cString(v)
		}
		return nil
	})
	if err != nil {
		return Event{}, false, fmt.Errorf("rtnetlink: address on index %d: %w", ev.Index, err)
	}
	// IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer's
	// on a point-to-point link, and the same as IFA_LOCAL otherwise.
	if local != nil {
		address = local
	}
	if len(address) != size {
		return Event{}, false, fmt.Errorf("rtnetlink: address on index %d: %d address bytes for family %d, want %d", ev.Index, len(address), family, size)
	}
	if plen > size*8 {
		return Event{}, false, fmt.Errorf("rtnetlink: address on index %d: prefix length %d for a %d-bit address", ev.Index, plen, size*8)
	}
	a, _ := netip.AddrFromSlice(address) // cannot fail: 4 or 16 bytes
	ev.Address = netip.PrefixFrom(a, plen).String()
	return ev, true, nil
}

// routeFilter is the Watcher's view of its rtnetlink socket. It learns from
// link messages which interfaces are of a kind that never carries an HCA's
// GIDs (noGIDKind) and drops address events on them, so pod churn does not
// cause rescans. Replies to the dump that seeds it (dumpPort, dumpSeq)
// teach kinds but are not events: nothing changed. Used by one goroutine.
type routeFilter struct {
	noGIDs            map[int32]bool
	dumpPort, dumpSeq uint32 // 0: no dump asked for
}

// dumpSeq marks the replies to the Watcher's dump; notifications carry the
// seq of whoever made the change, and another port id.
const dumpSeq = 1

func (r *routeFilter) parse(b []byte) ([]Event, error) {
	var out []Event
	err := eachRoute(b, func(m routeMsg) {
		if m.ev.Source == Link {
			// Interface indexes are not reused soon (the kernel allocates
			// them cyclically), so a lost dellink leaves a harmless entry.
			if m.ev.Action == "newlink" && noGIDKind(m.kind) {
				if r.noGIDs == nil {
					r.noGIDs = map[int32]bool{}
				}
				r.noGIDs[m.ev.Index] = true
			} else {
				delete(r.noGIDs, m.ev.Index)
			}
		}
		switch {
		case r.dumpSeq != 0 && m.seq == r.dumpSeq && m.pid == r.dumpPort:
		case m.ev.Source == Link && ignoredLinkKinds[m.kind]:
		case m.ev.Source == Address && r.noGIDs[m.ev.Index]:
		default:
			out = append(out, m.ev)
		}
	})
	return out, err
}

// walkAttrs calls f for each rtattr (length u16, type u16, value, padded).
func walkAttrs(b []byte, f func(typ uint16, val []byte) error) error {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4]) & 0x3fff // without NLA_F_NESTED/NET_BYTEORDER
		if n < 4 || n > len(b) {
			return fmt.Errorf("attribute length %d outside 4..%d", n, len(b))
		}
		if err := f(typ, b[4:n]); err != nil {
			return err
		}
		if adv := align(n); adv < len(b) {
			b = b[adv:]
		} else {
			b = nil
		}
	}
	return nil
}

func align(n int) int { return (n + rtaAlignBytes - 1) &^ (rtaAlignBytes - 1) }

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
