package hca

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// Parsers for the binary PCI files sysfs exposes (config, vpd) and for
// modalias. Like those of parse.go they return an error that says what is
// wrong, never panic, and are fuzzed.

// pciID is what a function's modalias says about it.
type pciID struct {
	vendor, device uint16
	class          uint32 // base class, subclass, programming interface: 0x030200
}

// parseModalias parses "pci:v000015B3d00001023sv000015B3sd00000026bc02sc07i00",
// as the kernel writes a PCI function's modalias.
func parseModalias(s string) (pciID, error) {
	s = strings.TrimSpace(s)
	bad := func(why string) (pciID, error) {
		return pciID{}, fmt.Errorf("cannot parse %q: %s", s, why)
	}
	rest, ok := strings.CutPrefix(s, "pci:")
	if !ok {
		return bad(`want "pci:v<8 hex>d<8 hex>sv<8 hex>sd<8 hex>bc<2 hex>sc<2 hex>i<2 hex>"`)
	}
	var id pciID
	var class [3]uint64
	for _, f := range []struct {
		key    string
		digits int
		dst    func(uint64)
	}{
		{"v", 8, func(v uint64) { id.vendor = uint16(v) }},
		{"d", 8, func(v uint64) { id.device = uint16(v) }},
		{"sv", 8, nil},
		{"sd", 8, nil},
		{"bc", 2, func(v uint64) { class[0] = v }},
		{"sc", 2, func(v uint64) { class[1] = v }},
		{"i", 2, func(v uint64) { class[2] = v }},
	} {
		if !strings.HasPrefix(rest, f.key) || len(rest) < len(f.key)+f.digits {
			return bad("no " + f.key + " field")
		}
		digits := rest[len(f.key) : len(f.key)+f.digits]
		v, err := strconv.ParseUint(digits, 16, 64)
		if err != nil {
			return bad("field " + f.key + " is not hex")
		}
		if f.digits == 8 && v > 0xffff {
			return bad("field " + f.key + " is beyond 16 bits")
		}
		if f.dst != nil {
			f.dst(v)
		}
		rest = rest[len(f.key)+f.digits:]
	}
	if rest != "" {
		return bad("trailing " + strconv.Quote(rest))
	}
	id.class = uint32(class[0])<<16 | uint32(class[1])<<8 | uint32(class[2])
	return id, nil
}

// Extended capability IDs (PCIe base specification, 7.6 and 7.7).
const (
	extCapACS = 0x000d
	extCapATS = 0x000f
)

// ACS control bits (PCIe base specification, ACS Control Register).
const (
	acsSourceValidation  = 1 << 0
	acsTranslationBlock  = 1 << 1
	acsRequestRedirect   = 1 << 2
	acsCompletionRedir   = 1 << 3
	acsUpstreamForward   = 1 << 4
	acsEgressControl     = 1 << 5
	acsDirectTranslated  = 1 << 6
	extendedConfigOffset = 0x100
)

// pciConfig is what discovery reads of a function's configuration space.
type pciConfig struct {
	hasACS     bool
	acsCap     uint16 // ACS Capability Register: the features the port implements
	acsControl uint16 // ACS Control Register: the ones enabled
	hasATS     bool
}

// errShortConfig is a config file without the extended space: what a
// reader without CAP_SYS_ADMIN gets (64 bytes) or a conventional PCI device.
type errShortConfig struct{ n int }

func (e errShortConfig) Error() string {
	return fmt.Sprintf("%d bytes, no extended configuration space (the kernel shows its 4096 bytes to root only)", e.n)
}

// parseConfig walks the extended capability list of a function's config
// file. A list that loops, points backwards or out of the file is an
// error; a file shorter than the extended space is errShortConfig.
func parseConfig(b []byte) (pciConfig, error) {
	var c pciConfig
	if len(b) < 0x40 {
		return c, fmt.Errorf("%d bytes: shorter than a PCI header (64)", len(b))
	}
	if v := binary.LittleEndian.Uint16(b); v == 0xffff || v == 0 {
		return c, fmt.Errorf("vendor ID %#04x in the header: the function does not answer", v)
	}
	if len(b) < extendedConfigOffset+4 {
		return c, errShortConfig{len(b)}
	}
	off, seen := extendedConfigOffset, 0
	for off != 0 {
		if off < extendedConfigOffset || off%4 != 0 || off+4 > len(b) {
			return c, fmt.Errorf("extended capability pointer %#x is outside the extended space (%#x-%#x) or unaligned", off, extendedConfigOffset, len(b)-1)
		}
		if seen++; seen > (len(b)-extendedConfigOffset)/4 {
			return c, fmt.Errorf("extended capability list loops (at %#x)", off)
		}
		hdr := binary.LittleEndian.Uint32(b[off:])
		if hdr == 0 || hdr == 0xffffffff {
			break // no extended capabilities
		}
		switch hdr & 0xffff {
		case extCapACS:
			if off+8 > len(b) {
				return c, fmt.Errorf("ACS capability at %#x is cut off", off)
			}
			c.hasACS = true
			c.acsCap = binary.LittleEndian.Uint16(b[off+4:])
			c.acsControl = binary.LittleEndian.Uint16(b[off+6:])
		case extCapATS:
			c.hasATS = true
		}
		next := int(hdr >> 20 &^ 3)
		if next != 0 && next <= off {
			return c, fmt.Errorf("extended capability at %#x points back to %#x", off, next)
		}
		off = next
	}
	return c, nil
}

// acsString names the enabled ACS controls, e.g. "SV RR CR UF".
func acsString(control uint16) string {
	var out []string
	for _, b := range []struct {
		bit  uint16
		name string
	}{
		{acsSourceValidation, "SV"}, {acsTranslationBlock, "TB"}, {acsRequestRedirect, "RR"},
		{acsCompletionRedir, "CR"}, {acsUpstreamForward, "UF"}, {acsEgressControl, "EC"}, {acsDirectTranslated, "DT"},
	} {
		if control&b.bit != 0 {
			out = append(out, b.name)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, " ")
}

// VPD resource tags (PCI Local Bus specification 3.0, I.3).
const (
	vpdTagIDString = 0x82 // large: the product name
	vpdTagReadOnly = 0x90 // large: VPD-R, keywords
	vpdTagWritable = 0x91 // large: VPD-W
	vpdTagEnd      = 0x78 // small, length 0
)

// vpd is what discovery keeps of a function's Vital Product Data.
type vpd struct {
	name   string // the identifier string
	serial string // SN
	v3     string // V3: on ConnectX cards the UUID shared by the functions of one NIC (rdma_topo matches on it)
}

// parseVPD reads the resource list the kernel's vpd file holds: an
// identifier string, then VPD-R (and maybe VPD-W) keyword lists, then the
// end tag. A checksum (keyword RV) must make the bytes up to it sum to zero.
func parseVPD(b []byte) (vpd, error) {
	var v vpd
	off, sawEnd := 0, false
	for off < len(b) && !sawEnd {
		tag := b[off]
		if tag&0x80 == 0 { // small resource: length in the low 3 bits
			if tag&^7 != vpdTagEnd&^7 {
				return v, fmt.Errorf("byte %d: unexpected small resource tag %#02x", off, tag)
			}
			sawEnd = true
			break
		}
		if off+3 > len(b) {
			return v, fmt.Errorf("byte %d: large resource %#02x is cut off", off, tag)
		}
		n := int(binary.LittleEndian.Uint16(b[off+1:]))
		data := off + 3
		if data+n > len(b) {
			return v, fmt.Errorf("byte %d: resource %#02x of %d bytes runs past the end (%d)", off, tag, n, len(b))
		}
		switch tag {
		case vpdTagIDString:
			s, err := vpdText(b[data : data+n])
			if err != nil {
				return v, fmt.Errorf("identifier string: %w", err)
			}
			v.name = s
		case vpdTagReadOnly:
			if err := vpdKeywords(b, data, data+n, &v); err != nil {
				return v, fmt.Errorf("VPD-R at byte %d: %w", off, err)
			}
		case vpdTagWritable:
		default:
			return v, fmt.Errorf("byte %d: unknown large resource tag %#02x", off, tag)
		}
		off = data + n
	}
	if !sawEnd {
		return v, fmt.Errorf("no end tag in %d bytes", len(b))
	}
	return v, nil
}

// vpdKeywords reads the keywords of b[start:end] into v and checks RV.
func vpdKeywords(b []byte, start, end int, v *vpd) error {
	for off := start; off < end; {
		if off+3 > end {
			return fmt.Errorf("keyword at byte %d is cut off", off)
		}
		key, n := string(b[off:off+2]), int(b[off+2])
		val := off + 3
		if val+n > end {
			return fmt.Errorf("keyword %q of %d bytes runs past its resource", key, n)
		}
		switch key {
		case "SN", "V3":
			s, err := vpdText(b[val : val+n])
			if err != nil {
				return fmt.Errorf("keyword %s: %w", key, err)
			}
			if key == "SN" {
				v.serial = s
			} else {
				v.v3 = s
			}
		case "RV":
			if n == 0 {
				return fmt.Errorf("keyword RV is empty")
			}
			var sum byte
			for _, c := range b[:val+1] {
				sum += c
			}
			if sum != 0 {
				return fmt.Errorf("checksum (RV) does not match: the bytes up to it sum to %#02x, want 0", sum)
			}
		}
		off = val + n
	}
	return nil
}

// vpdText is printable ASCII with trailing spaces and NULs dropped.
func vpdText(b []byte) (string, error) {
	for i, c := range b {
		if (c < 0x20 || c > 0x7e) && c != 0 {
			return "", fmt.Errorf("byte %d (%#02x) is not printable ASCII", i, c)
		}
	}
	return strings.TrimRight(string(b), " \x00"), nil
}
