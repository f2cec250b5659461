package kevents

// Parsers of the two wire formats. They take untrusted bytes: a short or
// garbled message is an error, never a panic (fuzzed).

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
)

// rtnetlink constants (linux/netlink.h, linux/rtnetlink.h, linux/if_link.h).
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

// ParseLink reads the rtnetlink messages of one datagram and returns the
// link events among them, without the virtual interfaces that are never an
// HCA's netdev.
func ParseLink(b []byte) ([]Event, error) {
	var out []Event
	for len(b) > 0 {
		if len(b) < nlmsgHdrLen {
			return out, fmt.Errorf("rtnetlink: %d trailing bytes, shorter than a message header", len(b))
		}
		n := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		if n < nlmsgHdrLen || n > len(b) {
			return out, fmt.Errorf("rtnetlink: message length %d outside 16..%d", n, len(b))
		}
		msg := b[nlmsgHdrLen:n]
		if adv := align(n); adv < len(b) {
			b = b[adv:]
		} else {
			b = nil
		}
		if typ == nlmsgDone {
			break
		}
		if typ != rtmNewLink && typ != rtmDelLink {
			continue
		}
		ev, keep, err := parseIfinfo(typ, msg)
		if err != nil {
			return out, err
		}
		if keep {
			out = append(out, ev)
		}
	}
	return out, nil
}

func parseIfinfo(typ uint16, msg []byte) (Event, bool, error) {
	if len(msg) < ifinfomsgLen {
		return Event{}, false, fmt.Errorf("rtnetlink: link message of %d bytes, shorter than ifinfomsg", len(msg))
	}
	flags := binary.NativeEndian.Uint32(msg[8:12])
	ev := Event{Source: Link, Action: "newlink", Subsystem: "net",
		Index: int32(binary.NativeEndian.Uint32(msg[4:8])), Up: flags&iffUp != 0, Carrier: flags&iffLowerUp != 0}
	if typ == rtmDelLink {
		ev.Action = "dellink"
	}
	kind := ""
	err := walkAttrs(msg[ifinfomsgLen:], func(t uint16, v []byte) error {
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
		return Event{}, false, fmt.Errorf("rtnetlink: link %d: %w", ev.Index, err)
	}
	return ev, !ignoredLinkKinds[kind], nil
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
