package hcatest

import (
	"encoding/binary"
	"strconv"
	"strings"
)

// The binary files of a PCI function: config (the 4096 bytes of a PCIe
// function's configuration space, as root reads it) and vpd (the resource
// list up to its end tag, as the kernel sizes it).

// PCIe device/port types (PCI Express Capabilities Register, bits 7:4).
const (
	portEndpoint   = 0x0
	portRootPort   = 0x4
	portUpstream   = 0x5
	portDownstream = 0x6
)

// portType is what a function is in the tree: an endpoint, a root port
// (a bridge on the root bus), a switch upstream port (a bridge below a
// root port or a downstream port) or a downstream port (below an upstream
// port).
func (b *builder) portType(n *pciNode) int {
	if !n.bridge() {
		return portEndpoint
	}
	if len(n.path) == 2 {
		return portRootPort
	}
	if parent := b.pci[n.path[len(n.path)-2]]; parent != nil && b.portType(parent) == portUpstream {
		return portDownstream
	}
	return portUpstream
}

// busNumber is the bus of "dddd:bb:dd.f".
func busNumber(busID string) int {
	parts := strings.Split(busID, ":")
	if len(parts) != 3 {
		return 0
	}
	v, _ := strconv.ParseUint(parts[1], 16, 8)
	return int(v)
}

// busRange is a bridge's secondary and subordinate bus: the lowest bus
// directly under it and the highest anywhere under it.
func (b *builder) busRange(n *pciNode) (int, int) {
	sec, sub := 0xff, 0
	for _, m := range b.pci {
		if len(m.path) <= len(n.path) || !prefix(m.path, n.path) {
			continue
		}
		bus := busNumber(m.busID())
		if len(m.path) == len(n.path)+1 {
			sec = min(sec, bus)
		}
		sub = max(sub, bus)
	}
	if sec == 0xff {
		return 0, 0
	}
	return sec, sub
}

func prefix(path, of []string) bool {
	for i := range of {
		if path[i] != of[i] {
			return false
		}
	}
	return true
}

// configSpace lays out a PCIe function: the header, a PCI Express
// capability (and a VPD capability when it has VPD) in the standard space,
// then AER, ACS and ATS in the extended space.
func (b *builder) configSpace(n *pciNode) []byte {
	c := make([]byte, 4096)
	le := binary.LittleEndian
	hex := func(s string) uint32 { v, _ := strconv.ParseUint(s, 16, 32); return uint32(v) }
	le.PutUint16(c[0x00:], uint16(hex(n.vendor)))
	le.PutUint16(c[0x02:], uint16(hex(n.device)))
	le.PutUint16(c[0x04:], 0x0006) // memory space, bus master
	le.PutUint16(c[0x06:], 0x0010) // capabilities list
	class := hex(n.class)
	c[0x09], c[0x0a], c[0x0b] = byte(class), byte(class>>8), byte(class>>16)
	typ := b.portType(n)
	if n.bridge() {
		c[0x0e] = 0x01
		sec, sub := b.busRange(n)
		c[0x18], c[0x19], c[0x1a] = byte(busNumber(n.busID())), byte(sec), byte(sub)
	} else {
		le.PutUint16(c[0x2c:], uint16(hex(n.subVendor)))
		le.PutUint16(c[0x2e:], uint16(hex(n.subDevice)))
	}
	c[0x34] = 0x40
	c[0x40] = 0x10 // PCI Express
	if n.vpd != nil {
		c[0x41] = 0x80
		c[0x80] = 0x03 // VPD
	}
	le.PutUint16(c[0x42:], uint16(0x2|typ<<4))

	type extCap struct {
		id, version uint32
		size        int
		body        func(at int)
	}
	caps := []extCap{{id: 0x0001, version: 2, size: 0x48}} // AER
	if n.acs != nil {
		acs := *n.acs
		caps = append(caps, extCap{id: 0x000d, version: 1, size: 8, body: func(at int) {
			le.PutUint16(c[at+4:], 0x005f) // SV TB RR CR UF DT implemented
			le.PutUint16(c[at+6:], acs)
		}})
	}
	if n.ats {
		caps = append(caps, extCap{id: 0x000f, version: 1, size: 8, body: func(at int) {
			le.PutUint16(c[at+4:], 0x0020)
			le.PutUint16(c[at+6:], 0x8000) // enabled
		}})
	}
	at := 0x100
	for i, e := range caps {
		next := 0
		if i+1 < len(caps) {
			next = at + e.size
		}
		le.PutUint32(c[at:], e.id|e.version<<16|uint32(next)<<20)
		if e.body != nil {
			e.body(at)
		}
		at += e.size
	}
	return c
}

// vpdBytes encodes v: an identifier string (tag 0x82), a VPD-R resource
// (tag 0x90) with PN, EC, SN, V3 and the RV checksum that makes every byte
// up to it sum to zero, and the end tag (0x78).
func vpdBytes(v VPDSpec) []byte {
	large := func(tag byte, data []byte) []byte {
		return append([]byte{tag, byte(len(data)), byte(len(data) >> 8)}, data...)
	}
	out := large(0x82, []byte(v.Name))
	var ro []byte
	for _, kw := range [][2]string{{"PN", v.PartNumber}, {"EC", v.EC}, {"SN", v.Serial}, {"V3", v.V3}} {
		if kw[1] != "" {
			ro = append(ro, kw[0][0], kw[0][1], byte(len(kw[1])))
			ro = append(ro, kw[1]...)
		}
	}
	ro = append(ro, 'R', 'V', 1, 0) // RV: the checksum byte, filled below
	out = append(out, large(0x90, ro)...)
	var sum byte
	for _, c := range out[:len(out)-1] {
		sum += c
	}
	out[len(out)-1] = -sum
	return append(out, 0x78)
}
