package rdmanl

import (
	"errors"
	"fmt"
	"syscall"
)

// rtnetlink numbers from include/uapi/linux/rtnetlink.h and if_link.h
// (stable since long before Linux 6.1).
const (
	rtmNewLink = 16 // RTM_NEWLINK: also the answer to RTM_GETLINK
	rtmGetLink = 18 // RTM_GETLINK

	ifinfomsgLen = 16 // struct ifinfomsg: family, pad, type, index, flags, change
	iflaIfname   = 3  // IFLA_IFNAME: string
	iflaNetNSFD  = 28 // IFLA_NET_NS_FD: u32

	ifNameMax = 15 // IFNAMSIZ less the NUL
)

// RouteConn is one rtnetlink (NETLINK_ROUTE) socket, for the netdev half
// of moving an HCA: finding a netdev, moving it by index to another
// network namespace, and telling whether the node's own traffic needs it
// (uplink.go). Like Conn, it works in the namespace it was opened in.
type RouteConn struct{ c *Conn }

// DialRoute opens an rtnetlink socket in the calling thread's network
// namespace.
func DialRoute() (*RouteConn, error) {
	s, err := openSocket(protoRoute, Timeout)
	if err != nil {
		return nil, &Error{Op: "socket", Err: err, Route: true}
	}
	return &RouteConn{c: newConn(s)}, nil
}

// Close closes the socket.
func (r *RouteConn) Close() error { return r.c.Close() }

// checkIfname refuses what the kernel would refuse as a netdev name.
func checkIfname(name string) error {
	if name == "" || len(name) > ifNameMax {
		return fmt.Errorf("netdev name %q: want 1 to %d bytes", name, ifNameMax)
	}
	for _, c := range []byte(name) {
		if c == 0 || c == '/' || c == ':' || c <= ' ' || c == 0x7f {
			return fmt.Errorf("netdev name %q: byte %q is not allowed", name, c)
		}
	}
	return nil
}

// ifinfomsg is an all-zero struct ifinfomsg (AF_UNSPEC, no index): the
// kernel then finds the link by IFLA_IFNAME.
func ifinfomsg() []byte { return make([]byte, ifinfomsgLen) }

func strAttr(typ uint16, s string) attr { return attr{typ: typ, data: append([]byte(s), 0)} }

// ifinfomsgOf is a struct ifinfomsg naming the link by index.
func ifinfomsgOf(index int) []byte {
	b := ifinfomsg()
	ne.PutUint32(b[4:], uint32(int32(index)))
	return b
}

// encodeMoveLinkIndex moves the link with ifindex index into nsFD's
// namespace: by identity, so a rename since the index was read cannot
// make it move another netdev.
func encodeMoveLinkIndex(seq uint32, index int, nsFD uint32) []byte {
	return encodeMsg(rtmNewLink, flagRequest|flagAck, seq, ifinfomsgOf(index), u32Attr(iflaNetNSFD, nsFD))
}

// encodeGetLink asks for one link by name.
func encodeGetLink(seq uint32, name string) []byte {
	return encodeMsg(rtmGetLink, flagRequest, seq, ifinfomsg(), strAttr(iflaIfname, name))
}

// encodeMoveLink moves the link called name into nsFD's namespace, as
// "ip link set NAME netns NS" does.
func encodeMoveLink(seq uint32, name string, nsFD uint32) []byte {
	return encodeMsg(rtmNewLink, flagRequest|flagAck, seq, ifinfomsg(),
		strAttr(iflaIfname, name), u32Attr(iflaNetNSFD, nsFD))
}

// decodeLinkIndex reads ifi_index from an RTM_NEWLINK answer.
func decodeLinkIndex(payload []byte) (int, error) {
	if len(payload) < ifinfomsgLen {
		return 0, fmt.Errorf("%w: link answer of %d bytes, less than struct ifinfomsg", errTruncated, len(payload))
	}
	idx := int32(ne.Uint32(payload[4:]))
	if idx <= 0 {
		return 0, fmt.Errorf("link answer with interface index %d", idx)
	}
	return int(idx), nil
}

// LinkIndex finds the netdev called name in the socket's namespace; ok is
// false when there is none (ENODEV).
func (r *RouteConn) LinkIndex(name string) (index int, ok bool, err error) {
	op := "lookup of netdev " + name
	if err := checkIfname(name); err != nil {
		return 0, false, &Error{Op: op, Err: err, Route: true}
	}
	payloads, err := r.c.exchange(op, rtmNewLink, false, func(seq uint32) []byte { return encodeGetLink(seq, name) })
	if errors.Is(err, syscall.ENODEV) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, routeErr(err)
	}
	if len(payloads) != 1 {
		return 0, false, &Error{Op: op, Err: fmt.Errorf("%d answers, want 1", len(payloads)), Route: true}
	}
	idx, err := decodeLinkIndex(payloads[0])
	if err != nil {
		return 0, false, &Error{Op: op, Err: err, Route: true}
	}
	return idx, true, nil
}

// MoveLink moves the netdev called name from the socket's namespace into
// the one nsFD refers to. It fails with ENODEV when the socket's
// namespace has no such netdev.
func (r *RouteConn) MoveLink(name string, nsFD int) error {
	op := "netns move of netdev " + name
	if err := checkIfname(name); err != nil {
		return &Error{Op: op, Err: err, Route: true}
	}
	if nsFD < 0 {
		return &Error{Op: op, Err: fmt.Errorf("bad namespace fd %d", nsFD), Route: true}
	}
	_, err := r.c.exchange(op, rtmNewLink, false, func(seq uint32) []byte { return encodeMoveLink(seq, name, uint32(nsFD)) })
	return routeErr(err)
}

// MoveLinkIndex moves the netdev with ifindex index from the socket's
// namespace into the one nsFD refers to. It fails with ENODEV when the
// socket's namespace has no such netdev (it moved, or went away).
func (r *RouteConn) MoveLinkIndex(index, nsFD int) error {
	op := fmt.Sprintf("netns move of netdev ifindex %d", index)
	if index <= 0 {
		return &Error{Op: op, Err: errors.New("bad interface index"), Route: true}
	}
	if nsFD < 0 {
		return &Error{Op: op, Err: fmt.Errorf("bad namespace fd %d", nsFD), Route: true}
	}
	_, err := r.c.exchange(op, rtmNewLink, false, func(seq uint32) []byte { return encodeMoveLinkIndex(seq, index, uint32(nsFD)) })
	return routeErr(err)
}

func routeErr(err error) error {
	var e *Error
	if errors.As(err, &e) {
		e.Route = true
	}
	return err
}
