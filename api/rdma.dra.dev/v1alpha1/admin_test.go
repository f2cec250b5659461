package v1alpha1

import (
	"slices"
	"testing"
)

func TestBeyondGrant(t *testing.T) {
	on, off := ptr(true), ptr(false)
	tests := []struct {
		name         string
		claim, grant *HcaConfig
		want         []string
	}{
		{"nothing asked", &HcaConfig{Env: off, PKey: ptr("0x8001")}, Merge(), nil},
		{"both asked, none granted", &HcaConfig{ManagementDevices: on, MoveNetdev: on}, Merge(), []string{"managementDevices", "moveNetdev"}},
		{"granted", &HcaConfig{ManagementDevices: on}, Merge(&HcaConfig{ManagementDevices: on}), nil},
		{"turned off", &HcaConfig{ManagementDevices: off, MoveNetdev: off}, Merge(), nil},
		{"no grant at all", &HcaConfig{MoveNetdev: on}, nil, []string{"moveNetdev"}},
		{"no claim config", nil, nil, nil},
	}
	for _, tt := range tests {
		if got := tt.claim.BeyondGrant(tt.grant); !slices.Equal(got, tt.want) {
			t.Errorf("%s: BeyondGrant = %q, want %q", tt.name, got, tt.want)
		}
	}
}
