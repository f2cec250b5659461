package hca

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// The parsers below take one sysfs file's content (trailing newline already
// trimmed) and either return its value or an error that quotes the content.
// They are fuzzed: none may panic, whatever the kernel or a bad disk hands us.

// parseNumberedWord parses "4: ACTIVE" (port state, phys_state, node_type)
// into its number and word.
func parseNumberedWord(s string) (int, string, error) {
	num, word, ok := strings.Cut(s, ":")
	if !ok {
		return 0, "", fmt.Errorf("cannot parse %q: want \"<number>: <name>\"", s)
	}
	n, err := strconv.Atoi(strings.TrimSpace(num))
	word = strings.TrimSpace(word)
	if err != nil || n < 0 || word == "" || strings.ContainsAny(word, " \t\n") {
		return 0, "", fmt.Errorf("cannot parse %q: want \"<number>: <name>\"", s)
	}
	return n, word, nil
}

// rate is a port's parsed rate file.
type rate struct {
	gbps         float64
	width, speed string
}

// parseRate parses "400 Gb/sec (4X NDR)" or "2.5 Gb/sec (1X SDR)". The
// parenthesised part is optional: some drivers (iWARP, rxe) print only the
// number.
func parseRate(s string) (rate, error) {
	bad := fmt.Errorf("cannot parse %q: want \"<n> Gb/sec (<width> <speed>)\"", s)
	num, rest, ok := strings.Cut(s, " Gb/sec")
	if !ok {
		return rate{}, bad
	}
	g, err := strconv.ParseFloat(num, 64)
	if err != nil || !(g >= 0 && g <= 1e6) || num != strings.TrimSpace(num) {
		return rate{}, bad
	}
	r := rate{gbps: g}
	rest = strings.TrimSpace(rest)
	if rest == "" {
		return r, nil
	}
	if !strings.HasPrefix(rest, "(") || !strings.HasSuffix(rest, ")") {
		return rate{}, bad
	}
	fields := strings.Fields(rest[1 : len(rest)-1])
	if len(fields) != 2 || !strings.HasSuffix(fields[0], "X") {
		return rate{}, bad
	}
	r.width, r.speed = fields[0], fields[1]
	return r, nil
}

// parseGUID checks "a088:c203:0012:3a40" and returns it lower-cased.
func parseGUID(s string) (string, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 {
		return "", fmt.Errorf("cannot parse %q: want a GUID like a088:c203:0012:3a40", s)
	}
	for _, p := range parts {
		if len(p) != 4 || !isHex(p) {
			return "", fmt.Errorf("cannot parse %q: want a GUID like a088:c203:0012:3a40", s)
		}
	}
	return strings.ToLower(s), nil
}

// parseHexInt parses "0x1a" (lid, sm_lid) or the "0x15b3" PCI ids.
func parseHexInt(s string, bits int) (uint64, error) {
	h, ok := strings.CutPrefix(s, "0x")
	if !ok || h == "" || !isHex(h) {
		return 0, fmt.Errorf("cannot parse %q: want a hex number like 0x1a", s)
	}
	v, err := strconv.ParseUint(h, 16, bits)
	if err != nil {
		return 0, fmt.Errorf("cannot parse %q: %v", s, err)
	}
	return v, nil
}

// parsePCIID parses "0x15b3" into "15b3".
func parsePCIID(s string) (string, error) {
	v, err := parseHexInt(s, 16)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%04x", v), nil
}

// Bounds of a Linux device number (include/linux/kdev_t.h): a 12-bit
// major and a 20-bit minor.
const (
	maxDevMajor = 1<<12 - 1
	maxDevMinor = 1<<20 - 1
)

// parseDevNumbers parses a sysfs dev file, "231:192". It rejects numbers the
// kernel never gives a character device: major 0 (register_chrdev reads 0
// as "pick a major for me", so no driver ends up with it) and numbers beyond
// the 12-bit major or the 20-bit minor. Handing such a number to a container
// runtime makes every device node built from it fail.
func parseDevNumbers(s string) (major, minor uint32, err error) {
	ma, mi, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("cannot parse %q: want \"<major>:<minor>\"", s)
	}
	a, err1 := strconv.ParseUint(ma, 10, 32)
	b, err2 := strconv.ParseUint(mi, 10, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("cannot parse %q: want \"<major>:<minor>\"", s)
	}
	switch {
	case a == 0:
		return 0, 0, fmt.Errorf("major 0 in %q is not a device the kernel allocates", s)
	case a > maxDevMajor:
		return 0, 0, fmt.Errorf("major %d in %q is not a device the kernel allocates (majors end at %d)", a, s, maxDevMajor)
	case b > maxDevMinor:
		return 0, 0, fmt.Errorf("minor %d in %q is not a device the kernel allocates (minors end at %d)", b, s, maxDevMinor)
	}
	return uint32(a), uint32(b), nil
}

// parseGID parses a GID table entry. It returns the address and whether the
// slot is empty (all zeros).
func parseGID(s string) (netip.Addr, bool, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 8 {
		return netip.Addr{}, false, fmt.Errorf("cannot parse %q: want a GID of 8 groups of 4 hex digits", s)
	}
	var b [16]byte
	for i, p := range parts {
		if len(p) != 4 || !isHex(p) {
			return netip.Addr{}, false, fmt.Errorf("cannot parse %q: want a GID of 8 groups of 4 hex digits", s)
		}
		v, _ := strconv.ParseUint(p, 16, 16)
		b[2*i], b[2*i+1] = byte(v>>8), byte(v)
	}
	a := netip.AddrFrom16(b)
	return a, a.IsUnspecified(), nil
}

// parseNetnsMode parses module/ib_core/parameters/netns_mode (a bool
// parameter: Y means shared).
func parseNetnsMode(s string) (NetnsMode, error) {
	switch s {
	case "Y", "y", "1":
		return NetnsShared, nil
	case "N", "n", "0":
		return NetnsExclusive, nil
	}
	return NetnsUnknown, fmt.Errorf("cannot parse %q: want Y or N", s)
}

// parseNUMANode parses numa_node ("0", "-1").
func parseNUMANode(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < -1 || n >= 1024 {
		return -1, fmt.Errorf("cannot parse %q: want a NUMA node number or -1", s)
	}
	return n, nil
}

func isHex(s string) bool {
	for _, c := range s {
		switch {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
		default:
			return false
		}
	}
	return true
}
