package pkey_test

import (
	"strings"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/pkey"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in            string
		want          uint16
		wantErr       string // Parse; "" means success
		wantPartition string // ParsePartition, when it differs from Parse
	}{
		{in: "0x8001", want: 0x8001},
		{in: "7fff", want: 0x7fff},
		{in: "0XFFFF", want: 0xffff},
		{in: "1", want: 0x0001},
		{in: "0x0000", want: 0, wantPartition: `"0x0000" is not a partition (its low 15 bits are zero)`},
		{in: "0x8000", want: 0x8000, wantPartition: `"0x8000" is not a partition`},
		{in: "", wantErr: `want a P_Key of 1 to 4 hex digits such as "0x8001", got ""`},
		{in: "0x", wantErr: `got "0x"`},
		{in: "0x10000", wantErr: `got "0x10000"`},
		{in: "00001", wantErr: `got "00001"`},
		{in: "0x0x12", wantErr: `got "0x0x12"`},
		{in: "0x0X12", wantErr: `got "0x0X12"`},
		{in: "8001h", wantErr: `got "8001h"`},
		{in: "-1", wantErr: `got "-1"`},
		{in: "+1", wantErr: `got "+1"`},
		{in: "f_f", wantErr: `got "f_f"`},
		{in: " 0x8001", wantErr: `got " 0x8001"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			check := func(name string, got uint16, err error, wantErr string) {
				t.Helper()
				if wantErr == "" {
					if err != nil || got != tt.want {
						t.Errorf("%s(%q) = %#04x, %v; want %#04x", name, tt.in, got, err, tt.want)
					}
					return
				}
				if err == nil || !strings.Contains(err.Error(), wantErr) {
					t.Errorf("%s(%q) = %#04x, %v; want an error containing %q", name, tt.in, got, err, wantErr)
				}
			}
			v, err := pkey.Parse(tt.in)
			check("Parse", v, err, tt.wantErr)
			wantPartition := tt.wantPartition
			if wantPartition == "" {
				wantPartition = tt.wantErr
			}
			v, err = pkey.ParsePartition(tt.in)
			check("ParsePartition", v, err, wantPartition)
		})
	}
}
