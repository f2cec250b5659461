package kevents

import (
	"encoding/binary"
	"strings"
	"testing"
)

// linkMsg builds an rtnetlink link message as the kernel sends it.
func linkMsg(typ uint16, index int32, flags uint32, name, kind string) []byte {
	attr := func(t uint16, v []byte) []byte {
		b := make([]byte, 4, align(4+len(v)))
		binary.NativeEndian.PutUint16(b[0:], uint16(4+len(v)))
		binary.NativeEndian.PutUint16(b[2:], t)
		b = append(b, v...)
		return append(b, make([]byte, align(len(b))-len(b))...)
	}
	body := make([]byte, ifinfomsgLen)
	binary.NativeEndian.PutUint32(body[4:], uint32(index))
	binary.NativeEndian.PutUint32(body[8:], flags)
	body = append(body, attr(iflaIfname, append([]byte(name), 0))...)
	if kind != "" {
		body = append(body, attr(iflaLinkinfo|0x8000, attr(iflaInfoKind, append([]byte(kind), 0)))...)
	}
	hdr := make([]byte, nlmsgHdrLen)
	binary.NativeEndian.PutUint32(hdr[0:], uint32(nlmsgHdrLen+len(body)))
	binary.NativeEndian.PutUint16(hdr[4:], typ)
	return append(hdr, body...)
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
			got, err := ParseLink(tt.msg)
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

func FuzzParseLink(f *testing.F) {
	f.Add(linkMsg(rtmNewLink, 7, iffUp, "ens1f0np0", ""))
	f.Add(concat(linkMsg(rtmNewLink, 3, iffUp, "bond0", "bond"), linkMsg(rtmDelLink, 4, 0, "veth0", "veth")))
	f.Fuzz(func(t *testing.T, b []byte) {
		evs, _ := ParseLink(b)
		for _, ev := range evs {
			if ev.Source != Link {
				t.Fatalf("non-link event %+v", ev)
			}
		}
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
