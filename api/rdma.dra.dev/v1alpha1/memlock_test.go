package v1alpha1

import (
	"strings"
	"testing"
)

func TestParseMemlock(t *testing.T) {
	tests := []struct {
		in      string
		want    string // String() of the result
		wantErr string
	}{
		{in: "unlimited", want: "unlimited"},
		{in: "256Mi", want: "268435456"},
		{in: "8Mi", want: "8388608"},
		{in: "1G", want: "1000000000"},
		{in: "65536", want: "65536"},
		{in: "0", wantErr: `positive whole number of bytes such as 256Mi, got "0"`},
		{in: "-1Mi", wantErr: `positive whole number`},
		{in: "0.5", wantErr: `positive whole number`},
		{in: "Unlimited", wantErr: `want "unlimited" or a quantity of bytes such as 256Mi, got "Unlimited"`},
		{in: "", wantErr: `got ""`},
	}
	for _, tt := range tests {
		got, err := ParseMemlock(tt.in)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseMemlock(%q) = %v, %v; want error containing %q", tt.in, got, err, tt.wantErr)
			}
		case err != nil || got.String() != tt.want:
			t.Errorf("ParseMemlock(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func TestMemlockExceeds(t *testing.T) {
	mi := func(n int64) Memlock { return Memlock{Bytes: n << 20} }
	inf := Memlock{Unlimited: true}
	tests := []struct {
		m, ceiling Memlock
		want       bool
	}{
		{mi(256), mi(256), false},
		{mi(257), mi(256), true},
		{mi(1), inf, false},
		{inf, inf, false},
		{inf, mi(1 << 20), true},
	}
	for _, tt := range tests {
		if got := tt.m.Exceeds(tt.ceiling); got != tt.want {
			t.Errorf("%v.Exceeds(%v) = %v, want %v", tt.m, tt.ceiling, got, tt.want)
		}
	}
}

func TestDecodeMemlock(t *testing.T) {
	c, err := Decode([]byte(`{"apiVersion":"` + APIVersion + `","kind":"` + Kind + `","memlock":"256Mi"}`))
	if err != nil || c.Memlock == nil || *c.Memlock != "256Mi" {
		t.Fatalf("Decode = %+v, %v; want memlock 256Mi", c, err)
	}
	_, err = Decode([]byte(`{"apiVersion":"` + APIVersion + `","kind":"` + Kind + `","memlock":"lots"}`))
	if err == nil || !strings.HasPrefix(err.Error(), `memlock: want "unlimited"`) {
		t.Fatalf("Decode of memlock lots: %v; want an error naming the field", err)
	}
}
