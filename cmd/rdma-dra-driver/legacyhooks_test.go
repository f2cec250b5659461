package main

import (
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
	"github.com/rdma-dra/rdma-dra-driver/pkg/legacy"
)

// TestLegacyHooks: the device plugin's node-wide device carries the
// hostNetwork check whenever the switch is off (validatePolicy refuses the
// switch off without a hook, so no daemon runs with the check missing),
// and the default limits only where the node publishes the capacities,
// never above them or the per-claim ceiling.
func TestLegacyHooks(t *testing.T) {
	const hook = "/opt/rdma-dra-driver/bin/rdma-dra-hook"
	tests := []struct {
		name string
		o    options
		cfg  draplugin.Config
		want legacy.Hooks
	}{
		{name: "switch off: the check", o: options{hookPath: hook},
			want: legacy.Hooks{HookPath: hook, HostNetworkOnly: true}},
		{name: "switch on: no check", o: options{hookPath: hook, allowNonHostNetwork: true},
			want: legacy.Hooks{HookPath: hook}},
		{name: "switch on, no hook installed", o: options{hookPath: "rdma-dra-hook", allowNonHostNetwork: true}},
		{name: "defaults where the capacities are published, capped by them", o: options{hookPath: hook, defaultHCAHandles: 8, defaultHCAObjects: 5000},
			cfg:  draplugin.Config{Limits: draplugin.HCALimits{Handles: 4, Objects: 100000}},
			want: legacy.Hooks{HookPath: hook, HostNetworkOnly: true, HCAHandles: 4, HCAObjects: 5000}},
		{name: "memlock", o: options{hookPath: hook, memlock: "256Mi"},
			want: legacy.Hooks{HookPath: hook, HostNetworkOnly: true, Memlock: "268435456"}},
		{name: "memlock off", o: options{hookPath: hook, memlock: "off"},
			want: legacy.Hooks{HookPath: hook, HostNetworkOnly: true}},
		{name: "defaults capped by the per-claim ceiling", o: options{hookPath: hook, defaultHCAHandles: 8, defaultHCAObjects: 5000, claimMaxPercent: 25},
			cfg:  draplugin.Config{Limits: draplugin.HCALimits{Handles: 16, Objects: 1000}},
			want: legacy.Hooks{HookPath: hook, HostNetworkOnly: true, HCAHandles: 4, HCAObjects: 250}},
		{name: "defaults without the capacities: no limit hook", o: options{hookPath: hook, defaultHCAHandles: 8, defaultHCAObjects: 5000},
			want: legacy.Hooks{HookPath: hook, HostNetworkOnly: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := legacyHooks(&tt.o, tt.cfg)
			if got != tt.want {
				t.Errorf("legacyHooks = %+v, want %+v", got, tt.want)
			}
			if !tt.o.allowNonHostNetwork && !got.HostNetworkOnly {
				t.Errorf("switch off, but the device plugin's device carries no hostNetwork check")
			}
			if err := validatePolicy(&tt.o); !tt.o.allowNonHostNetwork && got.HookPath == "" && err == nil {
				t.Errorf("switch off without a hook, and validatePolicy lets the daemon start")
			}
		})
	}
}
