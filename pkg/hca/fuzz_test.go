package hca

import (
	"strings"
	"testing"
)

// The fuzz targets feed arbitrary file contents to each parser: none may
// panic, and an accepted value must be consistent with its input. Their seed
// corpus lives in testdata/fuzz/<target>.

func FuzzParseNumberedWord(f *testing.F) {
	for _, s := range []string{"4: ACTIVE", "5: LinkUp", "1: CA", ":", "9999999999999999999: X"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, w, err := parseNumberedWord(s)
		if err == nil && (n < 0 || w == "" || strings.ContainsAny(w, " \t\n")) {
			t.Fatalf("parseNumberedWord(%q) accepted %d %q", s, n, w)
		}
	})
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)", "25 Gb/sec", "( Gb/sec ()"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := parseRate(s)
		if err == nil && (r.gbps < 0 || r.gbps != r.gbps) {
			t.Fatalf("parseRate(%q) accepted rate %v", s, r.gbps)
		}
	})
}

func FuzzParseGUID(f *testing.F) {
	f.Add("a088:c203:0012:3a40")
	f.Add("::::")
	f.Fuzz(func(t *testing.T, s string) {
		g, err := parseGUID(s)
		if err == nil && len(g) != 19 {
			t.Fatalf("parseGUID(%q) accepted %q", s, g)
		}
	})
}

func FuzzParseGID(f *testing.F) {
	f.Add("fe80:0000:0000:0000:a088:c203:0012:3a40")
	f.Add("0000:0000:0000:0000:0000:ffff:0a00:0001")
	f.Add("0000:0000:0000:0000:0000:0000:0000:0000")
	f.Fuzz(func(t *testing.T, s string) {
		a, empty, err := parseGID(s)
		if err == nil && empty != a.IsUnspecified() {
			t.Fatalf("parseGID(%q): empty=%v for %v", s, empty, a)
		}
	})
}

func FuzzParseDevNumbers(f *testing.F) {
	f.Add("231:192")
	f.Add("10:58")
	f.Add("4294967295:4294967295")
	f.Fuzz(func(t *testing.T, s string) {
		ma, mi, err := parseDevNumbers(s)
		if err == nil && (ma == 0 || ma > maxDevMajor || mi > maxDevMinor) {
			t.Fatalf("parseDevNumbers(%q) accepted %d:%d, a number the kernel never allocates", s, ma, mi)
		}
	})
}

func FuzzParseHexInt(f *testing.F) {
	f.Add("0x1a")
	f.Add("0x15b3")
	f.Fuzz(func(t *testing.T, s string) {
		if v, err := parseHexInt(s, 16); err == nil && v > 0xffff {
			t.Fatalf("parseHexInt(%q, 16) = %d, beyond 16 bits", s, v)
		}
	})
}

func FuzzParseModalias(f *testing.F) {
	f.Add("pci:v000015B3d00001023sv000015B3sd00000026bc02sc07i00")
	f.Add("pci:v000010DEd00003182sv000010DEsd000016C1bc03sc02i00\n")
	f.Add("pci:v")
	f.Fuzz(func(t *testing.T, s string) {
		if id, err := parseModalias(s); err == nil && id.class > 0xffffff {
			t.Fatalf("parseModalias(%q) accepted class %#x", s, id.class)
		}
	})
}

func FuzzParseConfig(f *testing.F) {
	c := make([]byte, 4096)
	c[0], c[1] = 0xb3, 0x15
	c[0x100], c[0x102] = 0x01, 0x81 // AER, next 0x148
	c[0x148], c[0x14a] = 0x0d, 0x01 // ACS, last
	c[0x14e] = 0x19
	f.Add(c)
	f.Add(c[:64])
	f.Fuzz(func(t *testing.T, b []byte) {
		if cfg, err := parseConfig(b); err == nil && cfg.hasACS && len(b) < extendedConfigOffset+8 {
			t.Fatalf("parseConfig found ACS in %d bytes", len(b))
		}
	})
}

func FuzzParseVPD(f *testing.F) {
	f.Add([]byte("\x82\x03abc\x90\x08\x00SN\x01xRV\x01\x00\x78"))
	f.Add([]byte{0x78})
	f.Add([]byte{0x90, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := parseVPD(b)
		if err == nil && (len(v.serial) > len(b) || len(v.v3) > len(b) || len(v.name) > len(b)) {
			t.Fatalf("parseVPD(%q) made up %+v", b, v)
		}
	})
}
