package main

import (
	"strings"
	"testing"
)

func TestValidatePolicy(t *testing.T) {
	const hook = "/opt/rdma-dra-driver/bin/rdma-dra-hook"
	tests := []struct {
		name    string
		o       options
		wantErr string
	}{
		{name: "the default: switch off, hook installed", o: options{hookPath: hook, legacyRoute: "off"}},
		{name: "switch off without the hook", o: options{hookPath: "rdma-dra-hook", legacyRoute: "off"},
			wantErr: `--allow-non-host-network=false needs the hook (--hook-path="rdma-dra-hook" is not an absolute path)`},
		{name: "switch on without the hook", o: options{allowNonHostNetwork: true, legacyRoute: "off"}},
		{name: "negative default", o: options{hookPath: hook, legacyRoute: "off", defaultHCAHandles: -1}, wantErr: "--default-hca-handles=-1"},
		{name: "a per-claim ceiling", o: options{hookPath: hook, legacyRoute: "off", claimMaxPercent: 25}},
		{name: "a ceiling above the HCA", o: options{hookPath: hook, legacyRoute: "off", claimMaxPercent: 101}, wantErr: "--claim-max-percent=101: want 1 to 100"},
		{name: "a negative ceiling", o: options{hookPath: hook, legacyRoute: "off", claimMaxPercent: -5}, wantErr: "--claim-max-percent=-5: want 1 to 100"},
		{name: "required limits, a legacy route, no defaults", o: options{hookPath: hook, legacyRoute: "device-plugin", requireHCALimits: true, defaultHCAHandles: 4},
			wantErr: "--require-hca-limits with --legacy=device-plugin needs --default-hca-handles and --default-hca-objects"},
		{name: "memlock unlimited", o: options{hookPath: hook, legacyRoute: "off", memlock: "unlimited"}},
		{name: "memlock quantity", o: options{hookPath: hook, legacyRoute: "off", memlock: "8Mi"}},
		{name: "memlock off without the hook", o: options{allowNonHostNetwork: true, legacyRoute: "off", memlock: "off"}},
		{name: "memlock without the hook", o: options{allowNonHostNetwork: true, hookPath: "rdma-dra-hook", legacyRoute: "off", memlock: "unlimited"},
			wantErr: `--memlock=unlimited needs the hook (--hook-path="rdma-dra-hook" is not an absolute path)`},
		{name: "memlock bad", o: options{hookPath: hook, legacyRoute: "off", memlock: "lots"},
			wantErr: `--memlock: want "unlimited" or a quantity of bytes such as 256Mi, got "lots", or "off"`},
		{name: "required limits, a legacy route, defaults", o: options{hookPath: hook, legacyRoute: "dra", requireHCALimits: true, defaultHCAHandles: 4, defaultHCAObjects: 100}},
	}
	for _, tt := range tests {
		err := validatePolicy(&tt.o)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s: err %v, want %q", tt.name, err, tt.wantErr)
		}
	}
}
