package devices

import (
	"reflect"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

func TestMetadata(t *testing.T) {
	show := func(a resourceapi.DeviceAttribute) any {
		switch {
		case a.StringValue != nil:
			return *a.StringValue
		case a.IntValue != nil:
			return *a.IntValue
		case a.BoolValue != nil:
			return *a.BoolValue
		case a.VersionValue != nil:
			return "v" + *a.VersionValue
		}
		return nil
	}
	twoPorts := cx7()
	twoPorts.Ports = append(twoPorts.Ports, hca.Port{Number: 2, State: "DOWN", PhysState: "Polling",
		LinkLayer: hca.LinkLayerInfiniBand, RateGbps: 2.5, RoCEv2GIDIndex: -1})
	roce := bf3()
	roce.Ports[0].GIDs = []hca.GID{
		{Index: 1, GID: "fe80:0000:0000:0000:ba3f:d2ff:fe9a:40e0", Type: "RoCE v2", Netdev: "ens1f0np0"},
		{Index: 3, GID: "0000:0000:0000:0000:0000:ffff:0a00:0001", Type: "RoCE v2", Netdev: "ens1f0np0"},
	}
	tests := []struct {
		name    string
		h       hca.HCA
		shareID string
		want    map[string]any // a subset
		absent  []string
	}{
		{
			name: "InfiniBand: slice attributes, device node, LID, GID 0",
			h:    cx7(),
			want: map[string]any{
				"rdma.dra.dev/ibdev": "mlx5_0", "rdma.dra.dev/nodeGUID": "a088:c203:0012:3a40",
				"resource.kubernetes.io/pcieRoot": "pci0000:15", "rdma.dra.dev/uverbs": "/dev/infiniband/uverbs0",
				"rdma.dra.dev/port1State": "ACTIVE", "rdma.dra.dev/port1Lid": int64(26), "rdma.dra.dev/port1RateGbps": "400",
				"rdma.dra.dev/port1Gid0": "fe80:0000:0000:0000:a088:c203:0012:3a40", "rdma.dra.dev/port1Gid0Type": "IB/RoCE v1",
			},
			absent: []string{"rdma.dra.dev/port1RoceGidIndex", "rdma.dra.dev/port1Gid0Netdev", "rdma.dra.dev/shareID"},
		},
		{
			name: "every port, not only the first; fractional rate",
			h:    twoPorts,
			want: map[string]any{"rdma.dra.dev/port2State": "DOWN", "rdma.dra.dev/port2PhysState": "Polling", "rdma.dra.dev/port2RateGbps": "2.5"},
		},
		{
			name:    "RoCE: GID index, types and netdevs; the share",
			h:       roce,
			shareID: "share-1",
			want: map[string]any{
				"rdma.dra.dev/port1RoceGidIndex": int64(3), "rdma.dra.dev/port1Gid3": "0000:0000:0000:0000:0000:ffff:0a00:0001",
				"rdma.dra.dev/port1Gid3Type": "RoCE v2", "rdma.dra.dev/port1Gid3Netdev": "ens1f0np0", "rdma.dra.dev/shareID": "share-1",
			},
			absent: []string{"rdma.dra.dev/port1Lid"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Metadata(tt.h, hca.NetnsShared, tt.shareID, Options{})
			for k, want := range tt.want {
				if a, ok := got[k]; !ok || show(a) != want {
					t.Errorf("%s = %v (present %v), want %v", k, show(a), ok, want)
				}
			}
			for _, k := range tt.absent {
				if a, ok := got[k]; ok {
					t.Errorf("%s = %v, want it absent", k, show(a))
				}
			}
			for k, a := range got {
				if n := 0 + btoi(a.StringValue != nil) + btoi(a.IntValue != nil) + btoi(a.BoolValue != nil) + btoi(a.VersionValue != nil); n != 1 {
					t.Errorf("%s has %d values set, want exactly one", k, n)
				}
			}
		})
	}
}

// Every attribute a device has in the slice is in its metadata file with
// the same value: a process sees what the scheduler selected on (the
// real-node e2e found legacy=false missing).
func TestMetadataHasEverySliceAttribute(t *testing.T) {
	for _, h := range []hca.HCA{cx7(), bf3()} {
		inv := hca.Inventory{HCAs: []hca.HCA{h}, NetnsMode: hca.NetnsShared}
		devs := Devices(inv, Options{Shares: 10})
		if len(devs) != 1 {
			t.Fatalf("%s: %d devices", h.Name, len(devs))
		}
		md := Metadata(h, inv.NetnsMode, "", Options{})
		for k, want := range devs[0].Attributes {
			if got, ok := md[string(k)]; !ok || !reflect.DeepEqual(got, want) {
				t.Errorf("%s: metadata %s = %+v (present %v), the slice has %+v", h.Name, k, got, ok, want)
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestLegacyMetadata(t *testing.T) {
	got := LegacyMetadata([]hca.HCA{cx7(), bf3()}, Options{DriverName: "rdma.example.com"})
	if a := got["rdma.example.com/hcas"]; a.IntValue == nil || *a.IntValue != 2 {
		t.Errorf("hcas = %+v, want 2", a)
	}
	for k, want := range map[string]string{"rdma.example.com/hca0": "mlx5_0", "rdma.example.com/hca0Uverbs": "/dev/infiniband/uverbs0", "rdma.example.com/hca1": bf3().Name} {
		if a := got[k]; a.StringValue == nil || *a.StringValue != want {
			t.Errorf("%s = %+v, want %q", k, a, want)
		}
	}
}

func TestLimitCapacities(t *testing.T) {
	inv := hca.Inventory{HCAs: []hca.HCA{bf3()}}
	tests := []struct {
		name string
		opts Options
		want []string // capacity names
	}{
		{"exclusive: none", Options{HCAHandles: 64, HCAObjects: 4096}, nil},
		{"shared without the rdma controller", Options{Shares: 10}, []string{"rdma.dra.dev/shares"}},
		{"shared with limits", Options{Shares: 10, HCAHandles: 64, HCAObjects: 4096},
			[]string{"rdma.dra.dev/hcaHandles", "rdma.dra.dev/hcaObjects", "rdma.dra.dev/shares"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			devs := Devices(inv, tt.opts)
			if len(devs) != 1 {
				t.Fatalf("%d devices", len(devs))
			}
			var got []string
			for name := range devs[0].Capacity {
				got = append(got, string(name))
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("capacities %v, want %v", got, tt.want)
			}
			if c, ok := devs[0].Capacity["rdma.dra.dev/hcaHandles"]; ok {
				p := c.RequestPolicy
				if c.Value.Value() != 64 || p.Default.Value() != 0 || p.ValidRange.Min.Value() != 0 || p.ValidRange.Max.Value() != 64 {
					t.Errorf("hcaHandles = %+v, want 64 with default 0 and range 0..64: a claim that asks nothing is not limited", c)
				}
			}
			if n := len(devs[0].Attributes) + len(devs[0].Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
				t.Errorf("%d attributes and capacities, over the API's %d", n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
			}
		})
	}
}
