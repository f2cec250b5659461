package cdi

import (
	"strings"
	"testing"

	"tags.cncf.io/container-device-interface/pkg/parser"
)

func TestDeviceName(t *testing.T) {
	const uid = "8e5c8b4e-2f4a-4c3e-9d1b-0a6f3c2e1d00"
	const share = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
	tests := []struct {
		uid, device, share string
		want               string // "" means: sanitized, checked for validity only
	}{
		{uid, "mlx5-0", "", uid + "-mlx5-0"},
		{uid, "mlx5-0", share, uid + "-mlx5-0-" + share},
		{"uid-stale", "mlx5-0", "", "uid-stale-mlx5-0"},
		{uid, "mlx5_0", "", uid + "-mlx5_0"},
		{uid, "bad name/x", "", ""},
		{uid, "", "", ""},
		{"", "mlx5-0", "", ""},
		{"_uid", "mlx5-0", "", ""},
		{uid, "mlx5-0", "share!", ""},
		{"", "", "", ""},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		got := DeviceName(tt.uid, tt.device, tt.share)
		if err := parser.ValidateDeviceName(got); err != nil {
			t.Errorf("DeviceName(%q, %q, %q) = %q: %v", tt.uid, tt.device, tt.share, got, err)
		}
		if tt.want != "" && got != tt.want {
			t.Errorf("DeviceName(%q, %q, %q) = %q, want %q", tt.uid, tt.device, tt.share, got, tt.want)
		}
		if again := DeviceName(tt.uid, tt.device, tt.share); again != got {
			t.Errorf("DeviceName(%q, %q, %q) not deterministic: %q, then %q", tt.uid, tt.device, tt.share, got, again)
		}
		in := strings.Join([]string{tt.uid, tt.device, tt.share}, "|")
		if other, dup := seen[got]; dup {
			t.Errorf("DeviceName gives %q for both %s and %s", got, other, in)
		}
		seen[got] = in
	}
	// Sanitizing alone would map these to one name.
	if a, b := DeviceName(uid, "a/b", ""), DeviceName(uid, "a!b", ""); a == b {
		t.Errorf("different devices share the name %q", a)
	}
}

func TestQualifiedName(t *testing.T) {
	name := DeviceName("8e5c8b4e-2f4a-4c3e-9d1b-0a6f3c2e1d00", "mlx5-0", "")
	q := QualifiedName(name)
	if want := "rdma.dra.dev/hca=" + name; q != want {
		t.Fatalf("QualifiedName = %q, want %q", q, want)
	}
	vendor, class, n, err := parser.ParseQualifiedName(q)
	if err != nil || vendor != Vendor || class != Class || n != name {
		t.Errorf("ParseQualifiedName(%q) = %q, %q, %q, %v", q, vendor, class, n, err)
	}
}
