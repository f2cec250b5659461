package rdmanl

// What the node's own traffic needs of a netdev: moving the netdev that
// carries the default route, or the address the node is known by, into a
// pod cuts the node off (the kubelet, the API server, every other pod).

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// rtnetlink numbers from include/uapi/linux/rtnetlink.h and if_addr.h.
const (
	rtmNewAddr  = 20 // RTM_NEWADDR: also the answer to RTM_GETADDR
	rtmGetAddr  = 22 // RTM_GETADDR (dump)
	rtmNewRoute = 24 // RTM_NEWROUTE: also the answer to RTM_GETROUTE
	rtmGetRoute = 26 // RTM_GETROUTE (dump)

	rtmsgLen     = 12 // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
	ifaddrmsgLen = 8  // struct ifaddrmsg: family, prefixlen, flags, scope, index
	rtnexthopLen = 8  // struct rtnexthop: len, flags, hops, ifindex

	afInet  = 2  // AF_INET
	afInet6 = 10 // AF_INET6

	rtaOIF       = 4  // RTA_OIF: u32
	rtaMultipath = 9  // RTA_MULTIPATH: struct rtnexthop...
	rtaTable     = 15 // RTA_TABLE: u32, the table when it does not fit rtm_table
	rtaNHID      = 30 // RTA_NH_ID: u32, a nexthop object instead of RTA_OIF

	rtnUnicast  = 1   // RTN_UNICAST
	rtTableMain = 254 // RT_TABLE_MAIN

	ifaAddress = 1 // IFA_ADDRESS
	ifaLocal   = 2 // IFA_LOCAL
)

// route is what the default-route check reads of one RTM_NEWROUTE.
type route struct {
	family, dstLen, typ uint8
	table               uint32
	links               []int // RTA_OIF and each multipath nexthop's ifindex
	nhID                uint32
}

// encodeDump asks for every object of a dump request typ; family is the
// zeroed family header (struct rtmsg or ifaddrmsg, AF_UNSPEC: every family).
func encodeDump(typ uint16, familyLen int, seq uint32) []byte {
	return encodeMsg(typ, flagRequest|flagDump, seq, make([]byte, familyLen))
}

// rtAttrs splits what follows a family header of n bytes.
func rtAttrs(payload []byte, n int, what string) ([]attr, error) {
	if len(payload) < n {
		return nil, fmt.Errorf("%w: %s answer of %d bytes, less than its %d-byte header", errTruncated, what, len(payload), n)
	}
	return parseAttrs(payload[align4(n):])
}

func u32Of(a attr, what string) (uint32, error) {
	if a.nested || len(a.data) != 4 {
		return 0, fmt.Errorf("%s: want 4 bytes, got %d", what, len(a.data))
	}
	return ne.Uint32(a.data), nil
}

// decodeRoute decodes one RTM_NEWROUTE answer.
func decodeRoute(payload []byte) (route, error) {
	attrs, err := rtAttrs(payload, rtmsgLen, "route")
	if err != nil {
		return route{}, err
	}
	r := route{family: payload[0], dstLen: payload[1], table: uint32(payload[4]), typ: payload[7]}
	for _, a := range attrs {
		switch a.typ {
		case rtaOIF:
			v, err := u32Of(a, "RTA_OIF")
			if err != nil {
				return route{}, err
			}
			r.links = append(r.links, int(int32(v)))
		case rtaTable:
			if r.table, err = u32Of(a, "RTA_TABLE"); err != nil {
				return route{}, err
			}
		case rtaNHID:
			if r.nhID, err = u32Of(a, "RTA_NH_ID"); err != nil {
				return route{}, err
			}
		case rtaMultipath:
			for b := a.data; len(b) > 0; {
				if len(b) < rtnexthopLen {
					return route{}, fmt.Errorf("%w: RTA_MULTIPATH: %d bytes left, less than struct rtnexthop", errTruncated, len(b))
				}
				n := int(ne.Uint16(b))
				if n < rtnexthopLen || n > len(b) {
					return route{}, fmt.Errorf("%w: RTA_MULTIPATH: nexthop of length %d, %d bytes left", errTruncated, n, len(b))
				}
				r.links = append(r.links, int(int32(ne.Uint32(b[4:]))))
				b = b[min(align4(n), len(b)):]
			}
		}
	}
	return r, nil
}

// decodeAddr decodes one RTM_NEWADDR answer: the link's index and the
// address (IFA_LOCAL, the interface's own on a point-to-point link, and
// IFA_ADDRESS).
func decodeAddr(payload []byte) (index int, addrs []netip.Addr, err error) {
	attrs, err := rtAttrs(payload, ifaddrmsgLen, "address")
	if err != nil {
		return 0, nil, err
	}
	index = int(int32(ne.Uint32(payload[4:])))
	for _, a := range attrs {
		if a.typ != ifaAddress && a.typ != ifaLocal {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.data)
		if !ok {
			return 0, nil, fmt.Errorf("address of link %d: %d bytes, want 4 or 16", index, len(a.data))
		}
		if !slices.Contains(addrs, ip) {
			addrs = append(addrs, ip)
		}
	}
	return index, addrs, nil
}

// DefaultRouteLinks lists the ifindexes the main table's default routes
// (IPv4 and IPv6, each nexthop of a multipath one) leave by: the node's
// uplinks. Other tables are left out: per-NIC policy routing (a default
// route per RoCE NIC in a table of its own) is common on RDMA nodes and
// does not carry the node's own traffic. A default route through a
// nexthop object is an error: its netdev is not in the route, and
// guessing would fail open.
func (r *RouteConn) DefaultRouteLinks() ([]int, error) {
	const op = "route dump"
	payloads, err := r.c.exchange(op, rtmNewRoute, true, func(seq uint32) []byte { return encodeDump(rtmGetRoute, rtmsgLen, seq) })
	if err != nil {
		return nil, routeErr(err)
	}
	var links []int
	for _, p := range payloads {
		rt, err := decodeRoute(p)
		if err != nil {
			return nil, &Error{Op: op, Err: err, Route: true}
		}
		if rt.family != afInet && rt.family != afInet6 || rt.dstLen != 0 || rt.typ != rtnUnicast || rt.table != rtTableMain {
			continue
		}
		if len(rt.links) == 0 {
			return nil, &Error{Op: op, Err: fmt.Errorf("a default route of the main table names no interface (nexthop object %d): cannot tell which netdev carries it", rt.nhID), Route: true}
		}
		for _, l := range rt.links {
			if !slices.Contains(links, l) {
				links = append(links, l)
			}
		}
	}
	slices.Sort(links)
	return links, nil
}

// LinkAddrs lists the addresses of the netdev with ifindex index.
func (r *RouteConn) LinkAddrs(index int) ([]netip.Addr, error) {
	op := fmt.Sprintf("address dump for ifindex %d", index)
	payloads, err := r.c.exchange(op, rtmNewAddr, true, func(seq uint32) []byte { return encodeDump(rtmGetAddr, ifaddrmsgLen, seq) })
	if err != nil {
		return nil, routeErr(err)
	}
	var out []netip.Addr
	for _, p := range payloads {
		i, addrs, err := decodeAddr(p)
		if err != nil {
			return nil, &Error{Op: op, Err: err, Route: true}
		}
		if i == index {
			out = append(out, addrs...)
		}
	}
	return out, nil
}

// NodeUse says why the node's own traffic needs the netdev with ifindex
// index in the socket's namespace, or "" when it does not: it carries a
// default route of the main table, or holds one of nodeIPs (the node's
// Kubernetes InternalIPs).
func (r *RouteConn) NodeUse(index int, nodeIPs []netip.Addr) (string, error) {
	defaults, err := r.DefaultRouteLinks()
	if err != nil {
		return "", err
	}
	var addrs []netip.Addr
	if len(nodeIPs) > 0 {
		if addrs, err = r.LinkAddrs(index); err != nil {
			return "", err
		}
	}
	return nodeUse(index, defaults, addrs, nodeIPs), nil
}

// nodeUse is NodeUse's decision over what the kernel answered.
func nodeUse(index int, defaults []int, addrs, nodeIPs []netip.Addr) string {
	if slices.Contains(defaults, index) {
		return "carries the node's default route"
	}
	for _, ip := range nodeIPs {
		// An IPv4-mapped IPv6 InternalIP is the IPv4 address.
		if slices.Contains(addrs, ip.Unmap()) {
			return "holds the node's InternalIP " + ip.Unmap().String()
		}
	}
	return ""
}

// RouteClient opens an rtnetlink socket per question in the caller's
// namespace, so the zero value is ready and safe for concurrent use: the
// driver's prepare-time check of moveNetdev.
type RouteClient struct{}

// NetdevUse is NodeUse for the netdev called name. A name the caller's
// namespace does not have is an error: the caller is not in the namespace
// it means to protect (a daemon off the host network), or the netdev went.
func (RouteClient) NetdevUse(name string, nodeIPs []netip.Addr) (string, error) {
	r, err := DialRoute()
	if err != nil {
		return "", err
	}
	defer r.Close()
	index, ok, err := r.LinkIndex(name)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", &Error{Op: "lookup of netdev " + name, Err: errors.New("no such netdev in this network namespace (is the caller on the host network?)"), Route: true}
	}
	return r.NodeUse(index, nodeIPs)
}
