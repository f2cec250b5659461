package devices

import (
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

func TestClaimCeiling(t *testing.T) {
	for _, tt := range []struct{ capacity, percent, want int64 }{
		{1000, 25, 250},
		{1000000, 25, 250000},
		{3, 25, 1}, // never 0: a claim may ask for one
		{1000, 0, 1000},
		{1000, 100, 1000},
		{1000, 150, 1000},
	} {
		if got := ClaimCeiling(tt.capacity, tt.percent); got != tt.want {
			t.Errorf("ClaimCeiling(%d, %d%%) = %d, want %d", tt.capacity, tt.percent, got, tt.want)
		}
	}
}

// TestCapacityRequestPolicy: a shared HCA publishes hcaHandles and hcaObjects
// with a request policy of default 0, min 0, step 1 and, with a per-claim
// ceiling, that ceiling as the range's max (the scheduler refuses a claim
// asking for more); without one, the whole capacity.
func TestCapacityRequestPolicy(t *testing.T) {
	inv := hca.Inventory{HCAs: []hca.HCA{cx7()}, NetnsMode: hca.NetnsShared}
	for _, tt := range []struct {
		name                 string
		percent              int64
		wantHandles, wantObj int64
	}{
		{"a quarter", 25, 250, 250000},
		{"no ceiling", 0, 1000, 1000000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dev := Devices(inv, Options{Shares: 1000, HCAHandles: 1000, HCAObjects: 1000000, ClaimMaxPercent: tt.percent})[0]
			for name, want := range map[string][2]int64{CapacityHCAHandles: {1000, tt.wantHandles}, CapacityHCAObjects: {1000000, tt.wantObj}} {
				c, ok := dev.Capacity[d(name)]
				if !ok || c.RequestPolicy == nil || c.RequestPolicy.ValidRange == nil {
					t.Fatalf("%s: capacity %+v, want one with a request policy", name, c)
				}
				p := c.RequestPolicy
				if c.Value.Value() != want[0] || p.ValidRange.Max.Value() != want[1] || p.Default.Value() != 0 || p.ValidRange.Min.Value() != 0 || p.ValidRange.Step.Value() != 1 {
					t.Errorf("%s: value %s, default %s, range %s..%s step %s; want %d, 0, 0..%d step 1", name, c.Value.String(), p.Default.String(),
						p.ValidRange.Min.String(), p.ValidRange.Max.String(), p.ValidRange.Step.String(), want[0], want[1])
				}
			}
		})
	}
}
