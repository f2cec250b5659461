package hca

import "testing"

func TestParseNumberedWord(t *testing.T) {
	tests := []struct {
		in      string
		num     int
		word    string
		wantErr bool
	}{
		{in: "4: ACTIVE", num: 4, word: "ACTIVE"},
		{in: "1: DOWN", num: 1, word: "DOWN"},
		{in: "5: LinkUp", num: 5, word: "LinkUp"},
		{in: "1: CA", num: 1, word: "CA"},
		{in: "4: RNIC", num: 4, word: "RNIC"},
		{in: "ACTIVE", wantErr: true},
		{in: "banana: ACTIVE", wantErr: true},
		{in: "4:", wantErr: true},
		{in: "-1: DOWN", wantErr: true},
		{in: "4: LINK UP", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		n, w, err := parseNumberedWord(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("parseNumberedWord(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if n != tt.num || w != tt.word {
			t.Errorf("parseNumberedWord(%q) = %d, %q; want %d, %q", tt.in, n, w, tt.num, tt.word)
		}
	}
}

func TestParseRate(t *testing.T) {
	tests := []struct {
		in      string
		want    rate
		wantErr bool
	}{
		{in: "400 Gb/sec (4X NDR)", want: rate{400, "4X", "NDR"}},
		{in: "200 Gb/sec (4X HDR)", want: rate{200, "4X", "HDR"}},
		{in: "2.5 Gb/sec (1X SDR)", want: rate{2.5, "1X", "SDR"}},
		{in: "800 Gb/sec (4X XDR)", want: rate{800, "4X", "XDR"}},
		{in: "25 Gb/sec", want: rate{gbps: 25}},
		{in: "fast", wantErr: true},
		{in: "400 Gb/sec 4X NDR", wantErr: true},
		{in: "400 Gb/sec (NDR)", wantErr: true},
		{in: "-5 Gb/sec (1X SDR)", wantErr: true},
		{in: "NaN Gb/sec", wantErr: true},
		{in: "1e300 Gb/sec", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseRate(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("parseRate(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if got != tt.want {
			t.Errorf("parseRate(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

func TestParseGUID(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "a088:c203:0012:3a40", want: "a088:c203:0012:3a40"},
		{in: "A088:C203:0012:3A40", want: "a088:c203:0012:3a40"},
		{in: "a088:c203:0012", wantErr: true},
		{in: "a088:c203:0012:3a4", wantErr: true},
		{in: "zzzz:c203:0012:3a40", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseGUID(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseGUID(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseHexAndIDs(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{in: "0x1a", want: 26},
		{in: "0x0", want: 0},
		{in: "0xffff", want: 65535},
		{in: "0x10000", wantErr: true},
		{in: "26", wantErr: true},
		{in: "0x", wantErr: true},
		{in: "0x+1", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseHexInt(tt.in, 16)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseHexInt(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
	if id, err := parsePCIID("0x15b3"); err != nil || id != "15b3" {
		t.Errorf("parsePCIID(0x15b3) = %q, %v", id, err)
	}
	if id, err := parsePCIID("0x8"); err != nil || id != "0008" {
		t.Errorf("parsePCIID(0x8) = %q, %v; want zero-padded 0008", id, err)
	}
}

func TestParseDevNumbers(t *testing.T) {
	tests := []struct {
		in           string
		major, minor uint32
		wantErr      string // the whole error; "" = none
	}{
		{in: "231:192", major: 231, minor: 192},
		{in: "10:58", major: 10, minor: 58},
		{in: "231:0", major: 231, minor: 0}, // umad0
		{in: "4095:1048575", major: 4095, minor: 1048575},
		{in: "231", wantErr: `cannot parse "231": want "<major>:<minor>"`},
		{in: "a:b", wantErr: `cannot parse "a:b": want "<major>:<minor>"`},
		{in: "-1:3", wantErr: `cannot parse "-1:3": want "<major>:<minor>"`},
		{in: "99999999999:1", wantErr: `cannot parse "99999999999:1": want "<major>:<minor>"`},
		{in: "0:195", wantErr: `major 0 in "0:195" is not a device the kernel allocates`},
		{in: "0:0", wantErr: `major 0 in "0:0" is not a device the kernel allocates`},
		{in: "4096:1", wantErr: `major 4096 in "4096:1" is not a device the kernel allocates (majors end at 4095)`},
		{in: "231:1048576", wantErr: `minor 1048576 in "231:1048576" is not a device the kernel allocates (minors end at 1048575)`},
		{in: "4294967295:4294967295", wantErr: `major 4294967295 in "4294967295:4294967295" is not a device the kernel allocates (majors end at 4095)`},
	}
	for _, tt := range tests {
		ma, mi, err := parseDevNumbers(tt.in)
		gotErr := ""
		if err != nil {
			gotErr = err.Error()
		}
		if gotErr != tt.wantErr || ma != tt.major || mi != tt.minor {
			t.Errorf("parseDevNumbers(%q) = %d:%d, %q; want %d:%d, %q", tt.in, ma, mi, gotErr, tt.major, tt.minor, tt.wantErr)
		}
	}
}

func TestParseGIDAndRoCEIndex(t *testing.T) {
	if _, empty, err := parseGID("0000:0000:0000:0000:0000:0000:0000:0000"); err != nil || !empty {
		t.Errorf("zero GID: empty=%v err=%v, want empty", empty, err)
	}
	if _, _, err := parseGID("fe80::1"); err == nil {
		t.Error("parseGID accepted the short form fe80::1; the kernel always prints 8 groups")
	}
	gids := []GID{
		{Index: 0, GID: "fe80:0000:0000:0000:b83f:d2ff:fe12:3a48", Type: "IB/RoCE v1"},
		{Index: 1, GID: "fe80:0000:0000:0000:b83f:d2ff:fe12:3a48", Type: "RoCE v2"},
		{Index: 2, GID: "2001:0db8:0000:0000:0000:0000:0000:0001", Type: "RoCE v2"},
		{Index: 3, GID: "0000:0000:0000:0000:0000:ffff:0a00:0001", Type: "IB/RoCE v1"},
		{Index: 4, GID: "0000:0000:0000:0000:0000:ffff:0a00:0001", Type: "RoCE v2"},
	}
	if got := roceV2Index(gids); got != 4 {
		t.Errorf("roceV2Index = %d, want 4 (the IPv4-mapped RoCE v2 GID wins)", got)
	}
	if got := roceV2Index(gids[:3]); got != 2 {
		t.Errorf("roceV2Index without IPv4 = %d, want 2 (global IPv6)", got)
	}
	if got := roceV2Index(gids[:2]); got != -1 {
		t.Errorf("roceV2Index with link-local only = %d, want -1", got)
	}
}

func TestParseNetnsModeAndNUMA(t *testing.T) {
	for in, want := range map[string]NetnsMode{"Y": NetnsShared, "N": NetnsExclusive, "1": NetnsShared, "0": NetnsExclusive} {
		if got, err := parseNetnsMode(in); err != nil || got != want {
			t.Errorf("parseNetnsMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := parseNetnsMode("maybe"); err == nil {
		t.Error("parseNetnsMode(maybe) gave no error")
	}
	for in, want := range map[string]int{"0": 0, "1": 1, "-1": -1} {
		if got, err := parseNUMANode(in); err != nil || got != want {
			t.Errorf("parseNUMANode(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"x", "-2", "4096", ""} {
		if _, err := parseNUMANode(in); err == nil {
			t.Errorf("parseNUMANode(%q) gave no error", in)
		}
	}
}

func TestModelName(t *testing.T) {
	for _, tt := range []struct{ vendor, device, want string }{
		{"15b3", "1021", "ConnectX-7"},
		{"15b3", "a2dc", "BlueField-3"},
		{"15b3", "101d", "ConnectX-6 Dx"},
		{"14e4", "1750", "BCM57508"},
		{"8086", "1592", "E810-C"},
		{"1d0f", "efa1", "AWS EFA"},
		{"1234", "5678", ""},
	} {
		if got := modelName(tt.vendor, tt.device); got != tt.want {
			t.Errorf("modelName(%s, %s) = %q, want %q", tt.vendor, tt.device, got, tt.want)
		}
	}
}
