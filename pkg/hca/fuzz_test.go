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
