package rdmanl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The helpers below lay bytes out by hand, from the uapi headers
// (linux/netlink.h, rdma/rdma_netlink.h), not with the package's encoder.

var nat = binary.NativeEndian

// Message types as the kernel writes them: RDMA_NL_GET_TYPE(5, cmd).
const (
	typeGet     = 5<<10 | 1 // 0x1401
	typePortGet = 5<<10 | 5 // 0x1405
	typeSysGet  = 5<<10 | 6 // 0x1406
)

// nla is one struct nlattr with its data, padded to 4 bytes.
func nla(typ uint16, data []byte) []byte {
	b := make([]byte, 4, 4+len(data)+3)
	nat.PutUint16(b, uint16(4+len(data)))
	nat.PutUint16(b[2:], typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func u8b(v uint8) []byte   { return []byte{v} }
func u32b(v uint32) []byte { return nat.AppendUint32(nil, v) }
func u64b(v uint64) []byte { return nat.AppendUint64(nil, v) }
func strz(s string) []byte { return append([]byte(s), 0) }

// nlmsg is one struct nlmsghdr followed by attrs.
func nlmsg(typ, flags uint16, seq uint32, attrs ...[]byte) []byte {
	body := bytes.Join(attrs, nil)
	b := make([]byte, 16, 16+len(body))
	nat.PutUint32(b, uint32(16+len(body)))
	nat.PutUint16(b[4:], typ)
	nat.PutUint16(b[6:], flags)
	nat.PutUint32(b[8:], seq)
	nat.PutUint32(b[12:], 0) // the kernel's port id
	return append(b, body...)
}

// nlerr is an NLMSG_ERROR carrying -errno and the request's header.
func nlerr(seq uint32, errno syscall.Errno, reqType uint16) []byte {
	req := nlmsg(reqType, 1, seq)
	m := nlmsg(2, 0, seq, nat.AppendUint32(nil, uint32(-int32(errno))), req)
	return m
}

// nldone is the NLMSG_DONE ending a dump, with its error code.
func nldone(seq uint32, code int32) []byte {
	return nlmsg(3, 2, seq, nat.AppendUint32(nil, uint32(code)))
}

// rxeDevice is what Linux 6.1 answers for rxe0 on virtio-net: no
// FW_VERSION, a PAD before each u64 where the arch wants one.
func rxeDevice(seq uint32) []byte {
	return nlmsg(typeGet, 2, seq,
		nla(1, u32b(0)), nla(2, strz("rxe0")), nla(3, u32b(1)),
		nla(0, nil), nla(4, u64b(0x1234)),
		nla(0, nil), nla(6, u64b(0x505400fffe123456)),
		nla(0, nil), nla(7, u64b(0x505400fffe123456)),
		nla(14, u8b(1)), nla(67, strz("roce")))
}

func TestEncodeRequest(t *testing.T) {
	got := encodeRequest(cmdPortGet, true, 7, u32Attr(attrDevIndex, 3))
	want := []byte{
		24, 0, 0, 0, // nlmsg_len
		0x05, 0x14, // RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_PORT_GET)
		0x01, 0x03, // NLM_F_REQUEST | NLM_F_DUMP
		7, 0, 0, 0, // seq
		0, 0, 0, 0, // pid
		8, 0, 1, 0, // nlattr: len 8, RDMA_NLDEV_ATTR_DEV_INDEX
		3, 0, 0, 0,
	}
	if nat.Uint16([]byte{1, 0}) != 1 {
		t.Skip("this host's CPU is big-endian: the expected bytes are for a little-endian CPU (amd64, arm64), which this test waits for")
	}
	if !bytes.Equal(got, want) {
		t.Errorf("port dump request:\n got % x\nwant % x", got, want)
	}
	if got := encodeRequest(cmdSysGet, false, 1); !bytes.Equal(got, nlmsg(typeSysGet, 1, 1)) {
		t.Errorf("system query: got % x", got)
	}
	// An odd-length attribute is padded, its length field is not.
	b := appendAttr(nil, attr{typ: attrDevName, data: strz("mlx5_0")})
	if want := nla(2, strz("mlx5_0")); !bytes.Equal(b, want) || len(b) != 12 || nat.Uint16(b) != 11 {
		t.Errorf("string attribute: got % x, want % x", b, want)
	}
}

func TestDecodeDevice(t *testing.T) {
	tests := []struct {
		name    string
		attrs   [][]byte
		want    Device
		wantErr string
	}{
		{
			name: "rxe without firmware",
			attrs: [][]byte{nla(1, u32b(0)), nla(2, strz("rxe0")), nla(3, u32b(1)), nla(0, nil), nla(4, u64b(0x1234)),
				nla(0, nil), nla(6, u64b(0x505400fffe123456)), nla(0, nil), nla(7, u64b(0x505400fffe123456)),
				nla(14, u8b(1)), nla(67, strz("roce"))},
			want: Device{Index: 0, Name: "rxe0", NodeType: NodeTypeCA, NodeGUID: 0x505400fffe123456,
				SysImageGUID: 0x505400fffe123456, Ports: 1, Protocol: "roce"},
		},
		{
			name: "mlx5 with firmware and unknown attributes",
			attrs: [][]byte{nla(1, u32b(4)), nla(2, strz("mlx5_0")), nla(3, u32b(1)), nla(5, strz("28.39.2048")),
				nla(6, u64b(0xa088c20300123a40)), nla(7, u64b(0xa088c20300123a40)), nla(14, u8b(1)),
				nla(0x8000|15, nla(16, nla(17, strz("qp")))), // a nested table (RES_SUMMARY) is skipped
				nla(79, u8b(0)), nla(67, strz("ib"))},
			want: Device{Index: 4, Name: "mlx5_0", NodeType: NodeTypeCA, NodeGUID: 0xa088c20300123a40,
				SysImageGUID: 0xa088c20300123a40, Ports: 1, FWVersion: "28.39.2048", Protocol: "ib"},
		},
		{
			name:  "siw",
			attrs: [][]byte{nla(1, u32b(1)), nla(2, strz("siw0")), nla(3, u32b(1)), nla(14, u8b(4)), nla(67, strz("iw"))},
			want:  Device{Index: 1, Name: "siw0", NodeType: NodeTypeRNIC, Ports: 1, Protocol: "iw"},
		},
		{name: "no name", attrs: [][]byte{nla(1, u32b(2))}, wantErr: "device 2: no device index or name"},
		{name: "short GUID", attrs: [][]byte{nla(1, u32b(2)), nla(2, strz("rxe1")), nla(6, []byte{1, 2, 3})},
			wantErr: "device 2 (rxe1): attribute NODE_GUID (6): want 8 bytes, got 3"},
		{name: "name without NUL", attrs: [][]byte{nla(1, u32b(2)), nla(2, []byte("rxe1"))},
			wantErr: `attribute DEV_NAME (2): want a NUL-terminated string, got "rxe1"`},
		{name: "NUL inside a name", attrs: [][]byte{nla(1, u32b(2)), nla(2, []byte("rx\x00e\x00"))},
			wantErr: "attribute DEV_NAME (2): NUL at byte 2"},
		{name: "node type too long", attrs: [][]byte{nla(1, u32b(2)), nla(2, strz("x")), nla(14, u32b(1))},
			wantErr: "attribute DEV_NODE_TYPE (14): want 1 bytes, got 4"},
		{name: "attribute past the end", attrs: [][]byte{nla(1, u32b(2)), {40, 0, 2, 0, 'x', 0, 0, 0}},
			wantErr: "truncated message: attribute 2 of length 40"},
		{name: "attribute shorter than its header", attrs: [][]byte{{2, 0, 1, 0}},
			wantErr: "truncated message: attribute 1 of length 2"},
		{name: "stray bytes", attrs: [][]byte{nla(1, u32b(2)), {1, 2}},
			wantErr: "2 stray bytes after the last attribute"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeDevice(bytes.Join(tt.attrs, nil))
			checkErr(t, err, tt.wantErr)
			if diff := cmp.Diff(tt.want, got); tt.wantErr == "" && diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("error = %v, want one containing %q", err, want)
	}
}

func TestDecodePort(t *testing.T) {
	handle := [][]byte{nla(1, u32b(1)), nla(2, strz("siw0"))}
	port := func(extra ...[]byte) []byte { return bytes.Join(append(append([][]byte{}, handle...), extra...), nil) }
	tests := []struct {
		name    string
		payload []byte
		want    Port
		wantErr string
	}{
		{
			name:    "siw with its netdev",
			payload: port(nla(3, u32b(1)), nla(12, u8b(4)), nla(13, u8b(5)), nla(50, u32b(2)), nla(51, strz("eth0"))),
			want:    Port{DevIndex: 1, DevName: "siw0", Index: 1, State: 4, PhysState: 5, NetdevIndex: 2, Netdev: "eth0"},
		},
		{
			name: "InfiniBand port: LID attributes, no netdev",
			payload: port(nla(3, u32b(2)), nla(4, u64b(0xa651e848)), nla(0, nil), nla(8, u64b(0xfe80000000000000)),
				nla(9, u32b(0x1a)), nla(10, u32b(1)), nla(11, u8b(0)), nla(12, u8b(1)), nla(13, u8b(2))),
			want: Port{DevIndex: 1, DevName: "siw0", Index: 2, State: 1, PhysState: 2},
		},
		{name: "no port index", payload: port(nla(12, u8b(4))), wantErr: "device 1 (siw0): no port index"},
		{name: "netdev index without name", payload: port(nla(3, u32b(1)), nla(50, u32b(2))),
			wantErr: "port 1: a netdev index without a name"},
		{name: "short netdev index", payload: port(nla(3, u32b(1)), nla(50, []byte{2})),
			wantErr: "attribute NDEV_INDEX (50): want 4 bytes, got 1"},
		{name: "nested where a u8 belongs", payload: port(nla(3, u32b(1)), nla(0x8000|12, u8b(4))),
			wantErr: "attribute PORT_STATE (12): want 1 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodePort(tt.payload)
			checkErr(t, err, tt.wantErr)
			if diff := cmp.Diff(tt.want, got); tt.wantErr == "" && diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeSystem(t *testing.T) {
	tests := []struct {
		name    string
		attrs   [][]byte
		want    NetnsMode
		wantErr string
	}{
		{"shared", [][]byte{nla(66, u8b(1)), nla(78, u8b(1))}, NetnsShared, ""},
		{"exclusive", [][]byte{nla(66, u8b(0))}, NetnsExclusive, ""},
		{"unknown mode", [][]byte{nla(66, u8b(7))}, 0, "unknown netns mode 7"},
		{"absent", [][]byte{nla(78, u8b(1))}, 0, "no netns mode (attribute NETNS_MODE)"},
		{"wrong size", [][]byte{nla(66, u32b(1))}, 0, "attribute NETNS_MODE (66): want 1 bytes, got 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeSystem(bytes.Join(tt.attrs, nil))
			checkErr(t, err, tt.wantErr)
			if tt.wantErr == "" && got.NetnsMode != tt.want {
				t.Errorf("mode = %v, want %v", got.NetnsMode, tt.want)
			}
		})
	}
	if NetnsShared.String() != "shared" || NetnsExclusive.String() != "exclusive" || NetnsMode(9).String() != "NetnsMode(9)" {
		t.Error("NetnsMode names")
	}
}

func TestReply(t *testing.T) {
	const seq = 42
	tests := []struct {
		name      string
		dump      bool
		typ       uint16
		datagrams [][]byte
		wantN     int // payloads
		wantDone  bool
		wantErrno syscall.Errno
		wantErr   string
	}{
		{
			name: "dump over two datagrams", dump: true, typ: typeGet,
			datagrams: [][]byte{append(rxeDevice(seq), rxeDevice(seq)...), append(rxeDevice(seq), nldone(seq, 0)...)},
			wantN:     3, wantDone: true,
		},
		{
			name: "dump not finished yet", dump: true, typ: typeGet,
			datagrams: [][]byte{rxeDevice(seq)}, wantN: 1,
		},
		{
			name: "empty dump", dump: true, typ: typeGet,
			datagrams: [][]byte{nldone(seq, 0)}, wantDone: true,
		},
		{
			name: "dump cut short", dump: true, typ: typePortGet,
			datagrams: [][]byte{nldone(seq, -int32(syscall.EMSGSIZE))}, wantErrno: syscall.EMSGSIZE,
		},
		{
			name: "kernel refuses", dump: true, typ: typePortGet,
			datagrams: [][]byte{nlerr(seq, syscall.EOPNOTSUPP, typePortGet)}, wantErrno: syscall.EOPNOTSUPP,
		},
		{
			name: "single answer", typ: typeSysGet,
			datagrams: [][]byte{nlmsg(typeSysGet, 0, seq, nla(66, u8b(1)))}, wantN: 1, wantDone: true,
		},
		{
			name: "acknowledgement", typ: typeSysGet,
			datagrams: [][]byte{append(nlmsg(typeSysGet, 0, seq, nla(66, u8b(1))), nlerr(seq, 0, typeSysGet)...)},
			wantN:     1, wantDone: true,
		},
		{
			name: "noop skipped", dump: true, typ: typeGet,
			datagrams: [][]byte{append(nlmsg(1, 0, seq), nldone(seq, 0)...)}, wantDone: true,
		},
		{
			name: "another request's answer", dump: true, typ: typeGet,
			datagrams: [][]byte{rxeDevice(seq + 1)}, wantErr: "sequence number 43 to request 42",
		},
		{
			name: "wrong type", dump: true, typ: typeGet,
			datagrams: [][]byte{nlmsg(typePortGet, 2, seq)}, wantErr: "unexpected message type 0x1405 in reply to 0x1401",
		},
		{
			name: "overrun", dump: true, typ: typeGet,
			datagrams: [][]byte{nlmsg(4, 0, seq)}, wantErr: "overrun",
		},
		{
			name: "error message without a code", typ: typeSysGet,
			datagrams: [][]byte{nlmsg(2, 0, seq)}, wantErr: "truncated message: error message of 0 bytes",
		},
		{
			name: "positive error code", typ: typeSysGet,
			datagrams: [][]byte{nlmsg(2, 0, seq, u32b(5))}, wantErr: "impossible error code 5",
		},
		{
			name: "half a header", dump: true, typ: typeGet,
			datagrams: [][]byte{rxeDevice(seq)[:10]}, wantErr: "10 bytes left, less than a message header",
		},
		{
			name: "length past the datagram", dump: true, typ: typeGet,
			datagrams: [][]byte{rxeDevice(seq)[:40]}, wantErr: "truncated message: message length",
		},
		{
			name: "length below the header", dump: true, typ: typeGet,
			datagrams: [][]byte{{8, 0, 0, 0, 3, 0, 0, 0, 42, 0, 0, 0, 0, 0, 0, 0}}, wantErr: "message length 8",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := reply{seq: seq, typ: tt.typ, dump: tt.dump}
			var err error
			for _, d := range tt.datagrams {
				var msgs []message
				if msgs, err = splitMessages(d); err == nil {
					err = r.add(msgs)
				}
				if err != nil {
					break
				}
			}
			if tt.wantErrno != 0 {
				if !errors.Is(err, tt.wantErrno) {
					t.Fatalf("error = %v, want errno %v", err, tt.wantErrno)
				}
				return
			}
			checkErr(t, err, tt.wantErr)
			if tt.wantErr != "" {
				return
			}
			if len(r.payloads) != tt.wantN || r.done != tt.wantDone {
				t.Errorf("%d payloads, done %v; want %d, %v", len(r.payloads), r.done, tt.wantN, tt.wantDone)
			}
		})
	}
}

func TestParseNested(t *testing.T) {
	inner := bytes.Join([][]byte{nla(17, strz("qp")), nla(18, u64b(3))}, nil)
	outer := nla(0x8000|16, inner)
	list, err := parseAttrs(outer)
	if err != nil || len(list) != 1 || list[0].typ != 16 || !list[0].nested {
		t.Fatalf("outer: %+v, %v", list, err)
	}
	in, err := parseAttrs(list[0].data)
	if err != nil || len(in) != 2 || in[0].typ != 17 || string(in[0].data) != "qp\x00" || nat.Uint64(in[1].data) != 3 {
		t.Fatalf("inner: %+v, %v", in, err)
	}
	// The byte-order flag is masked off the type.
	if list, _ := parseAttrs(nla(0x4000|50, u32b(1))); len(list) != 1 || list[0].typ != 50 {
		t.Errorf("NLA_F_NET_BYTEORDER not masked: %+v", list)
	}
}

func TestErrorText(t *testing.T) {
	err := error(&Error{Op: "port dump of rxe0", Err: syscall.EOPNOTSUPP})
	if got, want := err.Error(), "rdma netlink: port dump of rxe0: operation not supported"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Error("errors.Is does not reach the errno")
	}
	if got := FormatGUID(0xa088c20300123a40); got != "a088:c203:0012:3a40" {
		t.Errorf("FormatGUID = %q", got)
	}
}

// FuzzDecode feeds garbage to every decoder: errors are fine, panics not.
func FuzzDecode(f *testing.F) {
	f.Add(rxeDevice(1))
	f.Add(append(rxeDevice(1), nldone(1, 0)...))
	f.Add(nlerr(1, syscall.EOPNOTSUPP, typePortGet))
	f.Add(nlmsg(typePortGet, 2, 1, nla(1, u32b(1)), nla(2, strz("siw0")), nla(3, u32b(1)), nla(50, u32b(2)), nla(51, strz("eth0"))))
	f.Add(nlmsg(typeSysGet, 0, 1, nla(66, u8b(0))))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, typ := range []uint16{typeGet, typePortGet, typeSysGet} {
			msgs, err := splitMessages(b)
			if err != nil {
				continue
			}
			r := reply{seq: 1, typ: typ, dump: typ != typeSysGet}
			_ = r.add(msgs)
			for _, m := range msgs {
				_, _ = decodeDevice(m.payload)
				_, _ = decodePort(m.payload)
				_, _ = decodeSystem(m.payload)
			}
		}
		_, _ = decodeDevice(b)
		_, _ = decodePort(b)
		_, _ = decodeSystem(b)
		_, _ = decodeLinkIndex(b)
	})
}
