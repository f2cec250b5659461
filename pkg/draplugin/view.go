package draplugin

import (
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// view is one discovered inventory and what follows from it. A rescan
// that changes anything makes a new view; a view is never changed, so a
// prepare reads the one it started with, without a lock.
type view struct {
	gen      uint64
	inv      hca.Inventory
	byDevice map[string]hca.HCA // usable HCAs by DRA device name
	// taintedSince is, for every published device with a problem, when it
	// was first seen (the taint's TimeAdded must not move between
	// publishes); nil unless TaintUnhealthy.
	taintedSince map[string]metav1.Time
	// replaced is closed when a newer view replaces this one.
	replaced chan struct{}
}

func (v *view) exclusive() bool { return v.inv.NetnsMode == hca.NetnsExclusive }

// usable returns the usable HCAs sorted by name.
func (v *view) usable() []hca.HCA {
	var out []hca.HCA
	for _, h := range v.inv.HCAs {
		if _, ok := v.byDevice[devices.DeviceName(h.Name)]; ok {
			out = append(out, h)
		}
	}
	return out
}

// usableNames are the ibdev names of usable(): the HCAs the legacy device
// gives a container.
func (v *view) usableNames() []string {
	var out []string
	for _, h := range v.usable() {
		out = append(out, h.Name)
	}
	return out
}

// isLegacy reports whether device is the legacy device standing for all
// HCAs.
func (c *Config) isLegacy(device string) bool {
	return c.LegacyShares > 0 && device == devices.LegacyDeviceName
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
