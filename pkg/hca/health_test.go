package hca_test

import (
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

func TestProblem(t *testing.T) {
	tests := []struct {
		state, phys, want string
	}{
		{"4: ACTIVE", "5: LinkUp", ""},
		{"1: DOWN", "3: Disabled", "port 1 is DOWN (Disabled)"},
		{"1: DOWN", "2: Polling", "port 1 is DOWN (Polling)"},
		{"2: INIT", "5: LinkUp", "port 1 is INIT (LinkUp)"},
		{"banana", "5: LinkUp", "port 1 is unknown (LinkUp)"},
	}
	for _, tt := range tests {
		n := preset(t, "softroce")
		if err := n.SetPortState("rxe0", 1, tt.state, tt.phys); err != nil {
			t.Fatal(err)
		}
		if got := discover(t, n).HCAs[0].Problem(); got != tt.want {
			t.Errorf("%s/%s: Problem() = %q, want %q", tt.state, tt.phys, got, tt.want)
		}
	}
	unusable := hca.HCA{Name: "x", UnusableReason: "no uverbs device"}
	if got := unusable.Problem(); got != "no uverbs device" {
		t.Errorf("unusable HCA: Problem() = %q", got)
	}
}

func TestPortStatesSeesAChange(t *testing.T) {
	n := preset(t, "dgx-h100")
	d := hca.NewDiscoverer(hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot))
	before, err := d.PortStates()
	if err != nil || len(before) != 10 {
		t.Fatalf("PortStates: %d ports, %v", len(before), err)
	}
	if err := n.SetPortState("mlx5_4", 1, "1: DOWN", "2: Polling"); err != nil {
		t.Fatal(err)
	}
	after, _ := d.PortStates()
	for k := range before {
		if (before[k] != after[k]) != (k == "mlx5_4/1") {
			t.Errorf("%s: before %q after %q", k, before[k], after[k])
		}
	}
}

func BenchmarkPortStates(b *testing.B) {
	spec, _ := hcatest.Preset("dgx-h100")
	n := build(b, spec)
	d := hca.NewDiscoverer(hca.WithSysfsRoot(n.SysfsRoot))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.PortStates(); err != nil {
			b.Fatal(err)
		}
	}
}
