package rdmanl

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Layouts from include/uapi/linux/rtnetlink.h: RTM_NEWADDR = 20,
// RTM_GETADDR = 22, RTM_NEWROUTE = 24, RTM_GETROUTE = 26; struct rtmsg
// (12 bytes), struct ifaddrmsg (8), struct rtnexthop (8); RTA_OIF = 4,
// RTA_MULTIPATH = 9, RTA_TABLE = 15, RTA_NH_ID = 30; IFA_ADDRESS = 1,
// IFA_LOCAL = 2.

// rtmsgb is a struct rtmsg of a unicast route.
func rtmsgb(family, dstLen, table, typ uint8) []byte {
	return []byte{family, dstLen, 0, 0, table, 3 /* RTPROT_BOOT */, 0, typ, 0, 0, 0, 0}
}

// nexthop is one struct rtnexthop without attributes.
func nexthop(ifindex int32) []byte {
	b := []byte{8, 0, 0, 0}
	return nat.AppendUint32(b, uint32(ifindex))
}

func ifaddrb(family uint8, index uint32) []byte {
	return nat.AppendUint32([]byte{family, 24, 0x80, 0}, index)
}

func TestEncodeUplink(t *testing.T) {
	littleEndian(t)
	tests := []struct {
		name      string
		got, want []byte
	}{
		{
			name: "RTM_NEWLINK moving ifindex 7",
			got:  encodeMoveLinkIndex(5, 7, 11),
			want: []byte{
				40, 0, 0, 0, 16, 0, 0x05, 0x00, 5, 0, 0, 0, 0, 0, 0, 0,
				0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // ifinfomsg: AF_UNSPEC, index 7
				8, 0, 28, 0, 11, 0, 0, 0, // IFLA_NET_NS_FD
			},
		},
		{
			name: "RTM_GETROUTE dump",
			got:  encodeDump(rtmGetRoute, rtmsgLen, 6),
			want: []byte{28, 0, 0, 0, 26, 0, 0x01, 0x03, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		},
		{
			name: "RTM_GETADDR dump",
			got:  encodeDump(rtmGetAddr, ifaddrmsgLen, 8),
			want: []byte{24, 0, 0, 0, 22, 0, 0x01, 0x03, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !bytes.Equal(tt.got, tt.want) {
				t.Errorf("\n got % x\nwant % x", tt.got, tt.want)
			}
		})
	}
}

func TestDecodeRoute(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
		want    route
		wantErr string
	}{
		{
			name:    "IPv4 default via eth0",
			payload: bytes.Join([][]byte{rtmsgb(2, 0, 254, 1), nla(15, u32b(254)), nla(4, u32b(2))}, nil),
			want:    route{family: 2, typ: 1, table: 254, links: []int{2}},
		},
		{
			name:    "a table beyond 255 in RTA_TABLE",
			payload: bytes.Join([][]byte{rtmsgb(10, 0, 252, 1), nla(15, u32b(1001)), nla(4, u32b(5))}, nil),
			want:    route{family: 10, typ: 1, table: 1001, links: []int{5}},
		},
		{
			name:    "multipath over two links",
			payload: bytes.Join([][]byte{rtmsgb(2, 0, 254, 1), nla(9, append(nexthop(3), nexthop(4)...))}, nil),
			want:    route{family: 2, typ: 1, table: 254, links: []int{3, 4}},
		},
		{
			name:    "nexthop object",
			payload: bytes.Join([][]byte{rtmsgb(2, 0, 254, 1), nla(30, u32b(12))}, nil),
			want:    route{family: 2, typ: 1, table: 254, nhID: 12},
		},
		{name: "short header", payload: []byte{2, 0, 0}, wantErr: "route answer of 3 bytes, less than its 12-byte header"},
		{name: "short RTA_OIF", payload: append(rtmsgb(2, 0, 254, 1), nla(4, []byte{1, 2})...), wantErr: "RTA_OIF: want 4 bytes, got 2"},
		{name: "cut nexthop", payload: append(rtmsgb(2, 0, 254, 1), nla(9, []byte{16, 0, 0, 0, 3, 0, 0, 0})...), wantErr: "RTA_MULTIPATH: nexthop of length 16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeRoute(tt.payload)
			checkErr(t, err, tt.wantErr)
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(route{})); tt.wantErr == "" && diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeAddr(t *testing.T) {
	ip4 := []byte{10, 0, 0, 5}
	ip6 := netip.MustParseAddr("fd00::5").AsSlice()
	idx, addrs, err := decodeAddr(bytes.Join([][]byte{ifaddrb(2, 7), nla(1, ip4), nla(2, ip4), nla(3, strz("eth0"))}, nil))
	if err != nil || idx != 7 || !slices.Equal(addrs, []netip.Addr{netip.MustParseAddr("10.0.0.5")}) {
		t.Errorf("IPv4: %d %v %v", idx, addrs, err)
	}
	idx, addrs, err = decodeAddr(bytes.Join([][]byte{ifaddrb(10, 3), nla(1, ip6)}, nil))
	if err != nil || idx != 3 || !slices.Equal(addrs, []netip.Addr{netip.MustParseAddr("fd00::5")}) {
		t.Errorf("IPv6: %d %v %v", idx, addrs, err)
	}
	_, _, err = decodeAddr(bytes.Join([][]byte{ifaddrb(2, 7), nla(1, []byte{10, 0, 0})}, nil))
	checkErr(t, err, "address of link 7: 3 bytes, want 4 or 16")
}

func TestNodeUse(t *testing.T) {
	ips := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, v := range s {
			out = append(out, netip.MustParseAddr(v))
		}
		return out
	}
	tests := []struct {
		name     string
		index    int
		defaults []int
		addrs    []netip.Addr
		nodeIPs  []netip.Addr
		want     string
	}{
		{"the uplink", 2, []int{2}, nil, nil, "carries the node's default route"},
		{"one of two multipath uplinks", 4, []int{3, 4}, nil, nil, "carries the node's default route"},
		{"the node's InternalIP", 7, []int{2}, ips("10.0.0.5", "fe80::1"), ips("10.0.0.5"), "holds the node's InternalIP 10.0.0.5"},
		{"the IPv6 InternalIP of a dual-stack node", 7, nil, ips("fd00::5"), ips("10.0.0.9", "fd00::5"), "holds the node's InternalIP fd00::5"},
		{"an IPv4-mapped InternalIP", 7, nil, ips("10.0.0.5"), ips("::ffff:10.0.0.5"), "holds the node's InternalIP 10.0.0.5"},
		{"a RoCE NIC of its own", 7, []int{2}, ips("192.168.1.5"), ips("10.0.0.5"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nodeUse(tt.index, tt.defaults, tt.addrs, tt.nodeIPs); got != tt.want {
				t.Errorf("nodeUse = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRouteConnUplink(t *testing.T) {
	// A route dump: an IPv4 default via 2, an IPv6 default via 3 in two
	// datagrams, a per-NIC default in table 101 via 7, a blackhole, and
	// a connected route via 7; then the address dump.
	routes := func(seq uint32) [][]byte {
		return [][]byte{
			append(nlmsg(24, 2, seq, rtmsgb(2, 0, 254, 1), nla(4, u32b(2))), nlmsg(24, 2, seq, rtmsgb(2, 0, 101, 1), nla(4, u32b(7)))...),
			append(nlmsg(24, 2, seq, rtmsgb(10, 0, 254, 1), nla(4, u32b(3))), nlmsg(24, 2, seq, rtmsgb(2, 0, 254, 6))...),
			append(nlmsg(24, 2, seq, rtmsgb(2, 24, 254, 1), nla(4, u32b(7))), nldone(seq, 0)...),
		}
	}
	addrs := func(seq uint32) [][]byte {
		return [][]byte{
			append(nlmsg(20, 2, seq, ifaddrb(2, 2), nla(2, []byte{10, 0, 0, 5})), nlmsg(20, 2, seq, ifaddrb(2, 7), nla(2, []byte{192, 168, 1, 5}))...),
			nldone(seq, 0),
		}
	}
	k := &ackKernel{answer: func(req message) [][]byte {
		switch req.typ {
		case 26:
			return routes(req.seq)
		case 22:
			return addrs(req.seq)
		case 16:
			return [][]byte{nlerr(req.seq, 0, req.typ)}
		}
		return [][]byte{nlerr(req.seq, syscall.EOPNOTSUPP, req.typ)}
	}}
	r := &RouteConn{c: newConn(k)}
	links, err := r.DefaultRouteLinks()
	if err != nil || !slices.Equal(links, []int{2, 3}) {
		t.Errorf("DefaultRouteLinks = %v, %v; want [2 3]", links, err)
	}
	node := []netip.Addr{netip.MustParseAddr("192.168.1.5")}
	for index, want := range map[int]string{2: "carries the node's default route", 7: "holds the node's InternalIP 192.168.1.5", 9: ""} {
		if got, err := r.NodeUse(index, node); err != nil || got != want {
			t.Errorf("NodeUse(%d) = %q, %v; want %q", index, got, err, want)
		}
	}
	if err := r.MoveLinkIndex(7, 3); err != nil {
		t.Errorf("MoveLinkIndex: %v", err)
	}
	checkErr(t, r.MoveLinkIndex(0, 3), "rtnetlink: netns move of netdev ifindex 0: bad interface index")

	// A default route through a nexthop object: the netdev is unknown, so
	// the check fails closed.
	k.answer = func(req message) [][]byte {
		return [][]byte{append(nlmsg(24, 2, req.seq, rtmsgb(2, 0, 254, 1), nla(30, u32b(12))), nldone(req.seq, 0)...)}
	}
	_, err = r.NodeUse(7, nil)
	checkErr(t, err, "rtnetlink: route dump: a default route of the main table names no interface (nexthop object 12)")
}

// TestRealKernelUplink asks this host's rtnetlink: each default route's
// link exists, lo carries none, and lo holds 127.0.0.1.
func TestRealKernelUplink(t *testing.T) {
	r, err := DialRoute()
	if err != nil {
		t.Skipf("no rtnetlink socket here: %v", err)
	}
	defer r.Close()
	links, err := r.DefaultRouteLinks()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if _, err := net.InterfaceByIndex(l); err != nil {
			t.Errorf("default route via ifindex %d: %v", l, err)
		}
	}
	why, err := r.NodeUse(1, []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	if err != nil || why != "holds the node's InternalIP 127.0.0.1" {
		t.Errorf("lo: %q, %v", why, err)
	}
	t.Logf("default routes via %v", links)
}

// TestRealKernelPortNetdev asks the kernel for each port's netdev by
// identity (RDMA_NLDEV_ATTR_NDEV_INDEX): on the VM's Soft-RoCE, rxe0's
// port names eth0's ifindex.
func TestRealKernelPortNetdev(t *testing.T) {
	c, err := Dial()
	if errors.Is(err, syscall.EPROTONOSUPPORT) {
		t.Skipf("no RDMA netlink on this kernel (ib_core not loaded): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dev, ok, err := c.Device("rxe0")
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		if _, err := os.Stat("/sys/class/infiniband/rxe0"); err == nil {
			t.Fatal("sysfs lists rxe0, RDMA netlink does not")
		}
		t.Skip("no rxe0 here (the VM suite adds it on eth0)")
	}
	ports, err := c.Ports(dev)
	if err != nil {
		t.Fatal(err)
	}
	eth0, err := net.InterfaceByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 1 || ports[0].NetdevIndex != uint32(eth0.Index) || ports[0].Netdev != "eth0" {
		t.Errorf("rxe0 ports %+v, want one whose netdev is eth0 (ifindex %d)", ports, eth0.Index)
	}
}

// TestRealKernelNetdevUse: lo is found and holds 127.0.0.1; a netdev
// this namespace lacks is an error, never a pass.
func TestRealKernelNetdevUse(t *testing.T) {
	if _, err := DialRoute(); err != nil {
		t.Skipf("no rtnetlink socket here: %v", err)
	}
	why, err := RouteClient{}.NetdevUse("lo", []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	if err != nil || why != "holds the node's InternalIP 127.0.0.1" {
		t.Errorf("lo: %q, %v", why, err)
	}
	_, err = RouteClient{}.NetdevUse("rdmanl-absent", nil)
	checkErr(t, err, "rtnetlink: lookup of netdev rdmanl-absent: no such netdev in this network namespace")
}

func TestDecodeLink(t *testing.T) {
	info := func(index uint32) []byte { return nat.AppendUint32([]byte{0, 0, 32, 0}, index) } // ARPHRD_INFINIBAND
	ifinfo := func(index uint32) []byte { return append(info(index), make([]byte, 8)...) }
	tests := []struct {
		name    string
		payload []byte
		want    Link
		wantErr string
	}{
		{
			name:    "IPoIB on its PCI function",
			payload: bytes.Join([][]byte{ifinfo(9), nla(3, strz("ibp23s0")), nla(13, u32b(1000)), nla(56, strz("0000:17:00.0")), nla(57, strz("pci"))}, nil),
			want:    Link{Index: 9, Name: "ibp23s0", Parent: "0000:17:00.0"},
		},
		{
			name:    "a VLAN on it, in a bond",
			payload: bytes.Join([][]byte{ifinfo(12), nla(3, strz("ibp23s0.8001")), nla(5, u32b(9)), nla(10, u32b(4))}, nil),
			want:    Link{Index: 12, Name: "ibp23s0.8001", Lower: 9, Master: 4},
		},
		{
			name:    "a veth whose peer is elsewhere",
			payload: bytes.Join([][]byte{ifinfo(14), nla(3, strz("veth0")), nla(5, u32b(2)), nla(37, u32b(0))}, nil),
			want:    Link{Index: 14, Name: "veth0"},
		},
		{name: "no name", payload: ifinfo(3), wantErr: `link answer without an index or a name (index 3, name "")`},
		{name: "name without NUL", payload: append(ifinfo(3), nla(3, []byte("eth0"))...), wantErr: "link 3: attribute 3: want a NUL-terminated string"},
		{name: "short IFLA_MASTER", payload: append(ifinfo(3), nla(10, []byte{1})...), wantErr: "link 3: IFLA_MASTER: want 4 bytes, got 1"},
		{name: "short header", payload: info(3), wantErr: "link answer of 8 bytes, less than its 16-byte header"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeLink(tt.payload)
			checkErr(t, err, tt.wantErr)
			if diff := cmp.Diff(tt.want, got); tt.wantErr == "" && diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestRealKernelLinks dumps this namespace's links: lo is index 1, every
// link agrees with the net package, and a netdev with a device under it
// names it as sysfs does.
func TestRealKernelLinks(t *testing.T) {
	r, err := DialRoute()
	if err != nil {
		t.Skipf("no rtnetlink socket here: %v", err)
	}
	defer r.Close()
	links, err := r.Links()
	if err != nil {
		t.Fatal(err)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != len(ifs) {
		t.Errorf("%d links, the net package lists %d", len(links), len(ifs))
	}
	for _, l := range links {
		i, err := net.InterfaceByIndex(l.Index)
		if err != nil || i.Name != l.Name {
			t.Errorf("link %d %s: net package says %v, %v", l.Index, l.Name, i, err)
		}
		if target, err := os.Readlink("/sys/class/net/" + l.Name + "/device"); err == nil && l.Parent != "" && filepath.Base(target) != l.Parent {
			t.Errorf("link %s: parent %s, sysfs %s", l.Name, l.Parent, target)
		}
		t.Logf("%+v", l)
	}
}
