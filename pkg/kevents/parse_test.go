package kevents

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
)

// attr builds an rtattr, padded.
func attr(t uint16, v []byte) []byte {
	b := make([]byte, 4, align(4+len(v)))
	binary.NativeEndian.PutUint16(b[0:], uint16(4+len(v)))
	binary.NativeEndian.PutUint16(b[2:], t)
	b = append(b, v...)
	return append(b, make([]byte, align(len(b))-len(b))...)
}

// nlmsg puts an nlmsghdr with seq 0 and port id 0 (the kernel's own
// notifications) in front of body.
func nlmsg(typ uint16, body []byte) []byte {
	hdr := make([]byte, nlmsgHdrLen)
	binary.NativeEndian.PutUint32(hdr[0:], uint32(nlmsgHdrLen+len(body)))
	binary.NativeEndian.PutUint16(hdr[4:], typ)
	return append(hdr, body...)
}

// from sets the seq and port id of a message's header, as a reply to a
// request or a notification of another process's change carries them.
func from(m []byte, seq, pid uint32) []byte {
	m = append([]byte(nil), m...)
	binary.NativeEndian.PutUint32(m[8:], seq)
	binary.NativeEndian.PutUint32(m[12:], pid)
	return m
}

// linkMsg builds an rtnetlink link message as the kernel sends it.
func linkMsg(typ uint16, index int32, flags uint32, name, kind string) []byte {
	body := make([]byte, ifinfomsgLen)
	binary.NativeEndian.PutUint32(body[4:], uint32(index))
	binary.NativeEndian.PutUint32(body[8:], flags)
	body = append(body, attr(iflaIfname, append([]byte(name), 0))...)
	if kind != "" {
		body = append(body, attr(iflaLinkinfo|0x8000, attr(iflaInfoKind, append([]byte(kind), 0)))...)
	}
	return nlmsg(typ, body)
}

// ifaddrmsg builds the fixed part of an address message.
func ifaddrmsg(family, plen byte, index int32) []byte {
	b := make([]byte, ifaddrmsgLen)
	b[0], b[1] = family, plen
	binary.NativeEndian.PutUint32(b[4:], uint32(index))
	return b
}

// addrMsg builds an address message as the kernel sends it: IPv4 with
// IFA_ADDRESS, IFA_LOCAL and IFA_LABEL; IPv6 with IFA_ADDRESS alone.
func addrMsg(typ uint16, index int32, p netip.Prefix, label string) []byte {
	a := p.Addr().AsSlice()
	if p.Addr().Is4() {
		body := ifaddrmsg(afInet, byte(p.Bits()), index)
		body = append(body, attr(ifaAddress, a)...)
		body = append(body, attr(ifaLocal, a)...)
		body = append(body, attr(ifaLabel, append([]byte(label), 0))...)
		return nlmsg(typ, body)
	}
	return nlmsg(typ, append(ifaddrmsg(afInet6, byte(p.Bits()), index), attr(ifaAddress, a)...))
}

func uevent(fields ...string) []byte { return []byte(strings.Join(fields, "\x00") + "\x00") }

func TestParseUevent(t *testing.T) {
	tests := []struct {
		name    string
		msg     []byte
		want    Event
		ok      bool
		wantErr string
	}{
		{name: "ib device added", ok: true,
			msg:  uevent("add@/devices/pci0000:00/0000:00:01.0/0000:0c:00.0/infiniband/mlx5_0", "ACTION=add", "DEVPATH=/devices/pci0000:00/0000:00:01.0/0000:0c:00.0/infiniband/mlx5_0", "SUBSYSTEM=infiniband", "NAME=mlx5_0", "SEQNUM=4711"),
			want: Event{Source: Uevent, Action: "add", Subsystem: "infiniband", Name: "mlx5_0", DevPath: "/devices/pci0000:00/0000:00:01.0/0000:0c:00.0/infiniband/mlx5_0"}},
		{name: "uverbs removed, name from devpath", ok: true,
			msg:  uevent("remove@/devices/pci0000:00/0000:0c:00.0/infiniband_verbs/uverbs3", "ACTION=remove", "SUBSYSTEM=infiniband_verbs", "MAJOR=231", "MINOR=195"),
			want: Event{Source: Uevent, Action: "remove", Subsystem: "infiniband_verbs", Name: "uverbs3", DevPath: "/devices/pci0000:00/0000:0c:00.0/infiniband_verbs/uverbs3"}},
		{name: "physical netdev renamed", ok: true,
			msg:  uevent("move@/devices/pci0000:00/0000:3b:00.0/net/ens1f0np0", "ACTION=move", "SUBSYSTEM=net", "INTERFACE=ens1f0np0", "DEVPATH_OLD=/devices/pci0000:00/0000:3b:00.0/net/eth2"),
			want: Event{Source: Uevent, Action: "move", Subsystem: "net", Name: "ens1f0np0", DevPath: "/devices/pci0000:00/0000:3b:00.0/net/ens1f0np0"}},
		{name: "bond (RoCE LAG) kept", ok: true,
			msg:  uevent("change@/devices/virtual/net/bond0", "SUBSYSTEM=net", "INTERFACE=bond0"),
			want: Event{Source: Uevent, Action: "change", Subsystem: "net", Name: "bond0", DevPath: "/devices/virtual/net/bond0"}},
		{name: "pod veth ignored", msg: uevent("add@/devices/virtual/net/veth12ab", "SUBSYSTEM=net", "INTERFACE=veth12ab")},
		{name: "other subsystem ignored", msg: uevent("change@/devices/virtual/block/loop0", "SUBSYSTEM=block")},
		{name: "libudev re-broadcast ignored", msg: append([]byte("libudev\x00"), 0xfe, 0xed, 0xca, 0xfe)},
		{name: "empty", msg: nil, wantErr: "empty message"},
		{name: "no @", msg: uevent("garbage", "SUBSYSTEM=net"), wantErr: `header "garbage"`},
		{name: "no devpath", msg: uevent("add@"), wantErr: "not ACTION@DEVPATH"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := ParseUevent(tt.msg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ok != tt.ok {
				t.Fatalf("relevant = %t, want %t (%+v)", ok, tt.ok, got)
			}
			if ok && got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestParseLink: link messages through ParseRoute.
func TestParseLink(t *testing.T) {
	done := make([]byte, nlmsgHdrLen+4)
	binary.NativeEndian.PutUint32(done, uint32(len(done)))
	binary.NativeEndian.PutUint16(done[4:], nlmsgDone)
	route := linkMsg(24 /* RTM_NEWROUTE */, 1, 0, "x", "")

	tests := []struct {
		name    string
		msg     []byte
		want    []Event
		wantErr string
	}{
		{name: "carrier up", msg: linkMsg(rtmNewLink, 7, iffUp|iffLowerUp, "ens1f0np0", ""),
			want: []Event{{Source: Link, Action: "newlink", Subsystem: "net", Name: "ens1f0np0", Index: 7, Up: true, Carrier: true}}},
		{name: "deleted", msg: linkMsg(rtmDelLink, 9, 0, "ib3", ""),
			want: []Event{{Source: Link, Action: "dellink", Subsystem: "net", Name: "ib3", Index: 9}}},
		{name: "bond kept, veth dropped, route skipped, stops at DONE",
			msg:  concat(linkMsg(rtmNewLink, 3, iffUp, "bond0", "bond"), linkMsg(rtmNewLink, 40, iffUp, "veth1", "veth"), route, done, linkMsg(rtmNewLink, 5, 0, "after-done", "")),
			want: []Event{{Source: Link, Action: "newlink", Subsystem: "net", Name: "bond0", Index: 3, Up: true}}},
		{name: "short header", msg: []byte{1, 2, 3}, wantErr: "shorter than a message header"},
		{name: "length past the end", msg: func() []byte {
			m := linkMsg(rtmNewLink, 1, 0, "x", "")
			binary.NativeEndian.PutUint32(m, 4096)
			return m
		}(), wantErr: "message length 4096"},
		{name: "short ifinfomsg", msg: func() []byte {
			m := make([]byte, nlmsgHdrLen+4)
			binary.NativeEndian.PutUint32(m, uint32(len(m)))
			binary.NativeEndian.PutUint16(m[4:], rtmNewLink)
			return m
		}(), wantErr: "shorter than ifinfomsg"},
		{name: "bad attribute length", msg: func() []byte {
			m := linkMsg(rtmNewLink, 2, 0, "eth0", "")
			binary.NativeEndian.PutUint16(m[nlmsgHdrLen+ifinfomsgLen:], 200)
			return m
		}(), wantErr: "link 2: attribute length 200"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRoute(tt.msg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d events %+v, want %+v", len(got), got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("event %d: got %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func concat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

func FuzzParseRoute(f *testing.F) {
	f.Add(linkMsg(rtmNewLink, 7, iffUp, "ens1f0np0", ""))
	f.Add(concat(linkMsg(rtmNewLink, 3, iffUp, "bond0", "bond"), linkMsg(rtmDelLink, 4, 0, "veth0", "veth")))
	f.Add(addrMsg(rtmNewAddr, 7, netip.MustParsePrefix("192.0.2.7/24"), "ens1f0np0"))
	f.Add(concat(addrMsg(rtmDelAddr, 9, netip.MustParsePrefix("2001:db8::7/64"), ""), linkMsg(rtmNewLink, 9, 0, "eth1", "")))
	f.Fuzz(func(t *testing.T, b []byte) {
		evs, _ := ParseRoute(b)
		for _, ev := range evs {
			switch ev.Source {
			case Link:
			case Address:
				if _, err := netip.ParsePrefix(ev.Address); err != nil {
					t.Fatalf("address event %+v: %v", ev, err)
				}
			default:
				t.Fatalf("event of source %q from rtnetlink: %+v", ev.Source, ev)
			}
		}
		var r routeFilter
		_, _ = r.parse(b)
	})
}

func FuzzParseUevent(f *testing.F) {
	f.Add(uevent("add@/devices/pci0000:00/0000:0c:00.0/infiniband/mlx5_0", "SUBSYSTEM=infiniband", "NAME=mlx5_0"))
	f.Add(uevent("move@/devices/virtual/net/bond0", "SUBSYSTEM=net", "INTERFACE=bond0"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, ok, err := ParseUevent(b)
		if ok && (err != nil || ev.Source != Uevent || !subsystems[ev.Subsystem]) {
			t.Fatalf("relevant event %+v with error %v", ev, err)
		}
	})
}

func TestParseAddress(t *testing.T) {
	v4 := netip.MustParsePrefix("192.0.2.7/24")
	v6 := netip.MustParsePrefix("2001:db8::7/64")
	good := addrMsg(rtmNewAddr, 7, v4, "ens1f0np0")
	goodEvent := Event{Source: Address, Action: "newaddr", Subsystem: "net", Name: "ens1f0np0", Index: 7, Address: "192.0.2.7/24"}
	// withAttrs builds an IPv4 message with the given attributes.
	withAttrs := func(plen byte, attrs ...[]byte) []byte {
		return nlmsg(rtmNewAddr, concat(append([][]byte{ifaddrmsg(afInet, plen, 3)}, attrs...)...))
	}

	tests := []struct {
		name    string
		msg     []byte
		want    []Event // also what comes before an error
		wantErr string
	}{
		{name: "IPv4 added, named by its label", msg: good, want: []Event{goodEvent}},
		{name: "IPv6 removed, index only", msg: addrMsg(rtmDelAddr, 9, v6, ""),
			want: []Event{{Source: Address, Action: "deladdr", Subsystem: "net", Index: 9, Address: "2001:db8::7/64"}}},
		{name: "point-to-point: the local address, not the peer",
			msg:  withAttrs(32, attr(ifaAddress, []byte{10, 0, 0, 2}), attr(ifaLocal, []byte{10, 0, 0, 1})),
			want: []Event{{Source: Address, Action: "newaddr", Subsystem: "net", Index: 3, Address: "10.0.0.1/32"}}},
		{name: "unknown attributes skipped", msg: withAttrs(8, attr(6 /* IFA_CACHEINFO */, make([]byte, 16)), attr(ifaAddress, []byte{10, 1, 2, 3})),
			want: []Event{{Source: Address, Action: "newaddr", Subsystem: "net", Index: 3, Address: "10.1.2.3/8"}}},
		{name: "another family skipped",
			msg: nlmsg(rtmNewAddr, append(ifaddrmsg(45 /* AF_MCTP */, 0, 3), attr(ifaLocal, []byte{8})...))},
		{name: "links and addresses in order",
			msg: concat(linkMsg(rtmNewLink, 7, iffUp, "ens1f0np0", ""), good, addrMsg(rtmNewAddr, 7, v6, "")),
			want: []Event{{Source: Link, Action: "newlink", Subsystem: "net", Name: "ens1f0np0", Index: 7, Up: true}, goodEvent,
				{Source: Address, Action: "newaddr", Subsystem: "net", Index: 7, Address: "2001:db8::7/64"}}},
		{name: "short ifaddrmsg", msg: nlmsg(rtmNewAddr, []byte{afInet, 24, 0}), wantErr: "address message of 3 bytes, shorter than ifaddrmsg"},
		{name: "truncated datagram after a good message", msg: concat(good, good[:len(good)-5]),
			want: []Event{goodEvent}, wantErr: "message length 56 outside 16..51"},
		{name: "garbled attribute length", msg: func() []byte {
			m := append([]byte(nil), good...)
			binary.NativeEndian.PutUint16(m[nlmsgHdrLen+ifaddrmsgLen:], 300)
			return m
		}(), wantErr: "address on index 7: attribute length 300 outside 4..32"},
		{name: "no address", msg: withAttrs(24, attr(ifaLabel, []byte("eth0\x00"))), wantErr: "address on index 3: 0 address bytes for family 2, want 4"},
		{name: "IPv6 bytes for IPv4", msg: withAttrs(24, attr(ifaAddress, v6.Addr().AsSlice())), wantErr: "16 address bytes for family 2, want 4"},
		{name: "prefix longer than the address", msg: withAttrs(33, attr(ifaAddress, []byte{10, 0, 0, 1})), wantErr: "prefix length 33 for a 32-bit address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRoute(tt.msg)
			if tt.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d events %+v, want %+v", len(got), got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("event %d: got %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// TestRouteFilter: the Watcher's stateful view drops addresses on
// interfaces of kinds that never carry GIDs, learnt from the dump and from
// notifications, and the dump's replies are not events.
func TestRouteFilter(t *testing.T) {
	addr := func(typ uint16, index int32) []byte {
		return addrMsg(typ, index, netip.MustParsePrefix("198.51.100.1/24"), "")
	}
	done := nlmsg(nlmsgDone, make([]byte, 4))
	const port = 4242
	r := routeFilter{dumpPort: port, dumpSeq: dumpSeq}
	steps := []struct {
		name string
		msg  []byte
		want []Source // of the events, in order; their Index is checked too
		idx  []int32
	}{
		{name: "dump: kinds learnt, no events", msg: concat(
			from(linkMsg(rtmNewLink, 1, iffUp, "lo", ""), dumpSeq, port),
			from(linkMsg(rtmNewLink, 5, iffUp, "veth5", "veth"), dumpSeq, port),
			from(linkMsg(rtmNewLink, 6, iffUp, "br0", "bridge"), dumpSeq, port),
			from(linkMsg(rtmNewLink, 7, iffUp, "ens1f0np0", ""), dumpSeq, port),
			from(done, dumpSeq, port))},
		{name: "address on a veth from the dump dropped", msg: addr(rtmNewAddr, 5)},
		{name: "address on a bridge kept: an HCA's netdev may be its port", msg: addr(rtmNewAddr, 6), want: []Source{Address}, idx: []int32{6}},
		{name: "address on a physical netdev kept", msg: addr(rtmDelAddr, 7), want: []Source{Address}, idx: []int32{7}},
		{name: "new veth: link dropped, then its address", msg: concat(linkMsg(rtmNewLink, 8, iffUp, "veth8", "veth"), addr(rtmNewAddr, 8))},
		{name: "vlan: link dropped, address kept", msg: concat(linkMsg(rtmNewLink, 9, iffUp, "ens1f0np0.5", "vlan"), addr(rtmNewAddr, 9)),
			want: []Source{Address}, idx: []int32{9}},
		{name: "veth deleted: its index forgotten", msg: concat(linkMsg(rtmDelLink, 5, 0, "veth5", "veth"), addr(rtmNewAddr, 5)),
			want: []Source{Address}, idx: []int32{5}},
		{name: "another process's seq 1 is not the dump", msg: from(linkMsg(rtmNewLink, 7, iffUp, "ens1f0np0", ""), dumpSeq, 999),
			want: []Source{Link}, idx: []int32{7}},
	}
	for _, s := range steps {
		got, err := r.parse(s.msg)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if len(got) != len(s.want) {
			t.Fatalf("%s: got %d events %+v, want sources %v", s.name, len(got), got, s.want)
		}
		for i := range got {
			if got[i].Source != s.want[i] || got[i].Index != s.idx[i] {
				t.Errorf("%s: event %d is %+v, want %s of index %d", s.name, i, got[i], s.want[i], s.idx[i])
			}
		}
	}
}

func TestAddressEventString(t *testing.T) {
	for _, tt := range []struct {
		ev   Event
		want string
	}{
		{Event{Source: Address, Action: "newaddr", Name: "ens1f0np0", Index: 7, Address: "192.0.2.7/24"}, "address newaddr 192.0.2.7/24 on ens1f0np0 (index 7)"},
		{Event{Source: Address, Action: "deladdr", Index: 9, Address: "2001:db8::7/64"}, "address deladdr 2001:db8::7/64 on index 9"},
	} {
		if got := tt.ev.String(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.ev, got, tt.want)
		}
	}
}
