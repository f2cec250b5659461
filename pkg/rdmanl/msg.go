package rdmanl

import (
	"encoding/binary"
	"fmt"
	"syscall"
)

// Netlink framing (include/uapi/linux/netlink.h). RDMA netlink has no
// family header: attributes follow the nlmsghdr directly. Everything is in
// host byte order.
const (
	hdrLen     = 16 // struct nlmsghdr
	attrHdrLen = 4  // struct nlattr

	nlmsgNoop    = 1
	nlmsgError   = 2
	nlmsgDone    = 3
	nlmsgOverrun = 4

	flagRequest = 0x1
	flagMulti   = 0x2
	flagAck     = 0x4
	flagDump    = 0x300 // NLM_F_ROOT | NLM_F_MATCH

	attrTypeMask = 0x3fff // without NLA_F_NESTED and NLA_F_NET_BYTEORDER
	attrNested   = 0x8000
)

var ne = binary.NativeEndian

func align4(n int) int { return (n + 3) &^ 3 }

// attr is one netlink attribute; data excludes header and padding.
type attr struct {
	typ    uint16
	nested bool
	data   []byte
}

func u32Attr(typ uint16, v uint32) attr {
	b := make([]byte, 4)
	ne.PutUint32(b, v)
	return attr{typ: typ, data: b}
}

// appendAttr appends a's header, data and padding to b.
func appendAttr(b []byte, a attr) []byte {
	typ := a.typ
	if a.nested {
		typ |= attrNested
	}
	b = ne.AppendUint16(b, uint16(attrHdrLen+len(a.data)))
	b = ne.AppendUint16(b, typ)
	b = append(b, a.data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// encodeRequest builds one RDMA_NL_NLDEV query.
func encodeRequest(cmd uint16, dump bool, seq uint32, attrs ...attr) []byte {
	flags := uint16(flagRequest)
	if dump {
		flags |= flagDump
	}
	return encodeMsg(msgType(cmd), flags, seq, nil, attrs...)
}

// encodeMsg builds one netlink message: header, a family header (none in
// RDMA netlink, struct ifinfomsg in rtnetlink), attributes.
func encodeMsg(typ, flags uint16, seq uint32, family []byte, attrs ...attr) []byte {
	b := make([]byte, hdrLen, 64)
	ne.PutUint16(b[4:], typ)
	ne.PutUint16(b[6:], flags)
	ne.PutUint32(b[8:], seq)
	b = append(b, family...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	for _, a := range attrs {
		b = appendAttr(b, a)
	}
	ne.PutUint32(b[0:], uint32(len(b)))
	return b
}

// encodeSetNetns builds RDMA_NLDEV_CMD_SET moving device index into the
// network namespace of nsFD, acknowledged, as "rdma dev set DEV netns NS"
// sends it.
func encodeSetNetns(seq, index, nsFD uint32) []byte {
	return encodeMsg(msgType(cmdSet), flagRequest|flagAck, seq, nil,
		u32Attr(attrDevIndex, index), u32Attr(attrNetnsFD, nsFD))
}

// message is one netlink message of a datagram.
type message struct {
	typ, flags uint16
	seq        uint32
	payload    []byte
}

// splitMessages splits a datagram into its messages.
func splitMessages(b []byte) ([]message, error) {
	var out []message
	for len(b) > 0 {
		if len(b) < hdrLen {
			return nil, fmt.Errorf("%w: %d bytes left, less than a message header", errTruncated, len(b))
		}
		n := int(ne.Uint32(b))
		if n < hdrLen || n > len(b) {
			return nil, fmt.Errorf("%w: message length %d, %d bytes left", errTruncated, n, len(b))
		}
		out = append(out, message{
			typ: ne.Uint16(b[4:]), flags: ne.Uint16(b[6:]), seq: ne.Uint32(b[8:]),
			payload: b[hdrLen:n],
		})
		if a := align4(n); a < len(b) {
			b = b[a:]
		} else {
			b = nil
		}
	}
	return out, nil
}

// parseAttrs splits an attribute stream (a message payload or a nested
// attribute's data).
func parseAttrs(b []byte) ([]attr, error) {
	var out []attr
	for len(b) >= attrHdrLen {
		n := int(ne.Uint16(b))
		typ := ne.Uint16(b[2:])
		if n < attrHdrLen || n > len(b) {
			return nil, fmt.Errorf("%w: attribute %d of length %d, %d bytes left", errTruncated, typ&attrTypeMask, n, len(b))
		}
		out = append(out, attr{typ: typ & attrTypeMask, nested: typ&attrNested != 0, data: b[attrHdrLen:n]})
		if a := align4(n); a < len(b) {
			b = b[a:]
		} else {
			b = nil
		}
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d stray bytes after the last attribute", errTruncated, len(b))
	}
	return out, nil
}

// reply collects the answer to one request, datagram by datagram.
type reply struct {
	seq      uint32
	typ      uint16 // the request's type, which answers carry
	dump     bool
	payloads [][]byte
	done     bool
}

// add takes one datagram's messages. It fails with the kernel's errno
// (a syscall.Errno) or with a description of what was wrong.
func (r *reply) add(msgs []message) error {
	for _, m := range msgs {
		if r.done {
			return nil
		}
		if m.seq != r.seq {
			return fmt.Errorf("reply with sequence number %d to request %d", m.seq, r.seq)
		}
		switch m.typ {
		case nlmsgNoop:
		case nlmsgError:
			if len(m.payload) < 4 {
				return fmt.Errorf("%w: error message of %d bytes", errTruncated, len(m.payload))
			}
			if e := int32(ne.Uint32(m.payload)); e != 0 {
				return kernelErrno(e)
			}
			r.done = true // an acknowledgement
		case nlmsgDone:
			// A dump's end; it may carry the error that cut it short.
			if len(m.payload) >= 4 {
				if e := int32(ne.Uint32(m.payload)); e != 0 {
					return kernelErrno(e)
				}
			}
			r.done = true
		case nlmsgOverrun:
			return fmt.Errorf("the kernel dropped part of the reply (overrun)")
		case r.typ:
			r.payloads = append(r.payloads, m.payload)
			if !r.dump && m.flags&flagMulti == 0 {
				r.done = true
			}
		default:
			return fmt.Errorf("unexpected message type %#x in reply to %#x", m.typ, r.typ)
		}
	}
	return nil
}

// kernelErrno turns a netlink error code (a negative errno) into an Errno.
func kernelErrno(e int32) error {
	if e > 0 || e < -4095 {
		return fmt.Errorf("impossible error code %d", e)
	}
	return syscall.Errno(-e)
}

var attrNames = map[uint16]string{
	attrNetnsFD: "NET_NS_FD", attrDevIndex: "DEV_INDEX", attrDevName: "DEV_NAME", attrPortIndex: "PORT_INDEX",
	attrFWVersion: "FW_VERSION", attrNodeGUID: "NODE_GUID", attrSysImageGUID: "SYS_IMAGE_GUID",
	attrPortState: "PORT_STATE", attrPhysState: "PORT_PHYS_STATE", attrNodeType: "DEV_NODE_TYPE",
	attrNdevIndex: "NDEV_INDEX", attrNdevName: "NDEV_NAME", attrNetnsMode: "NETNS_MODE",
	attrProtocol: "DEV_PROTOCOL",
}

// attrSet is a message's attributes by type (the last one wins).
type attrSet map[uint16]attr

func attrsOf(payload []byte) (attrSet, error) {
	list, err := parseAttrs(payload)
	if err != nil {
		return nil, err
	}
	s := make(attrSet, len(list))
	for _, a := range list {
		if a.typ != attrPad {
			s[a.typ] = a
		}
	}
	return s, nil
}

func attrError(typ uint16, format string, args ...any) error {
	return fmt.Errorf("attribute %s (%d): %s", attrNames[typ], typ, fmt.Sprintf(format, args...))
}

// fixed returns the data of a fixed-size attribute; ok is false when it is
// absent.
func (s attrSet) fixed(typ uint16, size int) ([]byte, bool, error) {
	a, ok := s[typ]
	if !ok {
		return nil, false, nil
	}
	if a.nested || len(a.data) != size {
		return nil, false, attrError(typ, "want %d bytes, got %d", size, len(a.data))
	}
	return a.data, true, nil
}

func (s attrSet) u8(typ uint16) (uint8, bool, error) {
	b, ok, err := s.fixed(typ, 1)
	if !ok {
		return 0, false, err
	}
	return b[0], true, nil
}

func (s attrSet) u32(typ uint16) (uint32, bool, error) {
	b, ok, err := s.fixed(typ, 4)
	if !ok {
		return 0, false, err
	}
	return ne.Uint32(b), true, nil
}

func (s attrSet) u64(typ uint16) (uint64, bool, error) {
	b, ok, err := s.fixed(typ, 8)
	if !ok {
		return 0, false, err
	}
	return ne.Uint64(b), true, nil
}

// str returns a NUL-terminated string attribute.
func (s attrSet) str(typ uint16) (string, bool, error) {
	a, ok := s[typ]
	if !ok {
		return "", false, nil
	}
	n := len(a.data)
	if a.nested || n == 0 || a.data[n-1] != 0 {
		return "", false, attrError(typ, "want a NUL-terminated string, got %q", a.data)
	}
	for i, c := range a.data[:n-1] {
		if c == 0 {
			return "", false, attrError(typ, "NUL at byte %d of %q", i, a.data)
		}
	}
	return string(a.data[:n-1]), true, nil
}

// decoder reads one message's attributes and keeps the first error.
type decoder struct {
	s   attrSet
	err error
}

func (d *decoder) keep(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) u8(typ uint16, dst *uint8) bool {
	v, ok, err := d.s.u8(typ)
	d.keep(err)
	if ok {
		*dst = v
	}
	return ok
}

func (d *decoder) u32(typ uint16, dst *uint32) bool {
	v, ok, err := d.s.u32(typ)
	d.keep(err)
	if ok {
		*dst = v
	}
	return ok
}

func (d *decoder) u64(typ uint16, dst *uint64) bool {
	v, ok, err := d.s.u64(typ)
	d.keep(err)
	if ok {
		*dst = v
	}
	return ok
}

func (d *decoder) str(typ uint16, dst *string) bool {
	v, ok, err := d.s.str(typ)
	d.keep(err)
	if ok {
		*dst = v
	}
	return ok
}

// handle reads the device handle (index and name) every NLDEV reply starts
// with, and returns a prefix naming the device for errors.
func (d *decoder) handle(index *uint32, name *string) string {
	hasIdx := d.u32(attrDevIndex, index)
	hasName := d.str(attrDevName, name)
	if d.err == nil && (!hasIdx || !hasName) {
		d.err = fmt.Errorf("no device index or name (attributes DEV_INDEX, DEV_NAME)")
	}
	if hasName {
		return fmt.Sprintf("device %d (%s): ", *index, *name)
	}
	return fmt.Sprintf("device %d: ", *index)
}

// decodeDevice decodes one RDMA_NLDEV_CMD_GET answer.
func decodeDevice(payload []byte) (Device, error) {
	s, err := attrsOf(payload)
	if err != nil {
		return Device{}, err
	}
	var dev Device
	d := decoder{s: s}
	who := d.handle(&dev.Index, &dev.Name)
	d.u32(attrPortIndex, &dev.Ports)
	d.str(attrFWVersion, &dev.FWVersion)
	d.u64(attrNodeGUID, &dev.NodeGUID)
	d.u64(attrSysImageGUID, &dev.SysImageGUID)
	d.u8(attrNodeType, &dev.NodeType)
	d.str(attrProtocol, &dev.Protocol)
	if d.err != nil {
		return Device{}, fmt.Errorf("%s%w", who, d.err)
	}
	return dev, nil
}

// decodePort decodes one RDMA_NLDEV_CMD_PORT_GET answer.
func decodePort(payload []byte) (Port, error) {
	s, err := attrsOf(payload)
	if err != nil {
		return Port{}, err
	}
	var p Port
	d := decoder{s: s}
	who := d.handle(&p.DevIndex, &p.DevName)
	if !d.u32(attrPortIndex, &p.Index) && d.err == nil {
		d.err = fmt.Errorf("no port index (attribute PORT_INDEX)")
	}
	d.u8(attrPortState, &p.State)
	d.u8(attrPhysState, &p.PhysState)
	hasIdx := d.u32(attrNdevIndex, &p.NetdevIndex)
	hasName := d.str(attrNdevName, &p.Netdev)
	if d.err == nil && hasIdx != hasName {
		d.err = fmt.Errorf("port %d: a netdev index without a name, or a name without an index (attributes NDEV_INDEX, NDEV_NAME)", p.Index)
	}
	if d.err != nil {
		return Port{}, fmt.Errorf("%s%w", who, d.err)
	}
	return p, nil
}

// decodeSystem decodes the RDMA_NLDEV_CMD_SYS_GET answer.
func decodeSystem(payload []byte) (System, error) {
	s, err := attrsOf(payload)
	if err != nil {
		return System{}, err
	}
	var mode uint8
	d := decoder{s: s}
	if !d.u8(attrNetnsMode, &mode) && d.err == nil {
		return System{}, fmt.Errorf("no netns mode (attribute NETNS_MODE)")
	}
	if d.err != nil {
		return System{}, d.err
	}
	if mode > 1 {
		return System{}, attrError(attrNetnsMode, "unknown netns mode %d (want 0 exclusive or 1 shared)", mode)
	}
	return System{NetnsMode: NetnsMode(mode)}, nil
}
