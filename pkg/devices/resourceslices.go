package devices

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// DefaultDriverName is the driver name, and attribute domain, when
// Options.DriverName is empty.
const DefaultDriverName = "rdma.dra.dev"

// maxDevicesPerSlice is how many devices go into one ResourceSlice. Devices
// with taints or counters would lower it to
// resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures; none have them yet.
const maxDevicesPerSlice = resourceapi.ResourceSliceMaxDevices

// Options tune the mapping. The zero value is the default driver.
type Options struct {
	// DriverName is the DRA driver name, also the domain of the driver's
	// attributes ("<DriverName>/linkLayer"); DefaultDriverName when empty.
	// The caller validates it (a DNS subdomain of at most 63 characters);
	// an invalid name makes the apiserver reject every slice.
	DriverName string

	// Shares > 0 is the shared sharing mode: every HCA is published with
	// allowMultipleAllocations and a "shares" capacity of Shares, each
	// claim consuming one by default. Zero is exclusive: one claim per HCA.
	Shares int64

	// HCAHandles and HCAObjects > 0 (shared mode only) also publish every
	// HCA's capacities CapacityHCAHandles and CapacityHCAObjects: a claim
	// that consumes N of one gets rdma.max hca_handle=N (hca_object=N) on
	// that HCA in its containers. Nothing is consumed, and nothing limited,
	// unless the claim asks. Set them only where the kernel has the rdma
	// cgroup controller.
	HCAHandles, HCAObjects int64

	// ClaimMaxPercent (1..99) caps what one claim may consume of
	// HCAHandles and HCAObjects: the capacities' request policy publishes
	// ClaimCeiling as its maximum, so the scheduler refuses a claim that
	// asks for more. 0 or 100: a claim may ask for a whole HCA.
	ClaimMaxPercent int64

	// LegacyShares > 0 adds LegacyDeviceName, one multi-allocatable device
	// that stands for all usable HCAs of the node, for rdma/hca through a
	// DeviceClass with extendedResourceName (legacy route 2).
	LegacyShares int64

	// An HCA whose GPUDirect is not ready (hca.DataPath) is always tainted
	// with NoSchedule, key "<driver>/gpudirect-not-ready".
	//
	// TaintedSince, when set, taints every HCA whose port is not ACTIVE
	// with NoSchedule (key "<driver>/port-down"), so new claims avoid it
	// while claims already on it stay. The map gives each tainted device's
	// TimeAdded, which must not change between publishes; the caller keeps it.
	TaintedSince map[string]metav1.Time
}

func (o Options) driverName() string {
	if o.DriverName == "" {
		return DefaultDriverName
	}
	return o.DriverName
}

// DeviceName is the DRA device name of an ibdev: lower-cased, every
// character other than [a-z0-9-] (underscores included) replaced by "-",
// leading and trailing dashes trimmed, cut to a DNS label's 63 characters.
// mlx5_0 becomes mlx5-0. It returns "" when no valid label is left (an
// ibdev made only of punctuation); such an HCA is not published.
func DeviceName(ibdev string) string {
	var b strings.Builder
	b.Grow(len(ibdev))
	for _, r := range ibdev {
		switch {
		case 'a' <= r && r <= 'z', '0' <= r && r <= '9', r == '-':
			b.WriteRune(r)
		case 'A' <= r && r <= 'Z':
			b.WriteRune(r + 'a' - 'A')
		default:
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-")
	if len(name) > validation.DNS1123LabelMaxLength {
		name = strings.TrimRight(name[:validation.DNS1123LabelMaxLength], "-")
	}
	return name
}

// named is a published HCA with its device name.
type named struct {
	name string
	hca  *hca.HCA
}

// published picks the HCAs that become devices, sorted by device name: the
// usable ones with a non-empty device name. When two ibdevs map to the same
// device name (mlx5_0 and mlx5-0, only possible after a rename) the one
// whose ibdev sorts first wins, whatever the order of inv.HCAs.
func published(inv hca.Inventory) []named {
	out := make([]named, 0, len(inv.HCAs))
	for i := range inv.HCAs {
		h := &inv.HCAs[i]
		if !h.Usable {
			continue
		}
		if n := DeviceName(h.Name); n != "" {
			out = append(out, named{name: n, hca: h})
		}
	}
	slices.SortFunc(out, func(a, b named) int {
		return cmp.Or(strings.Compare(a.name, b.name), strings.Compare(a.hca.Name, b.hca.Name))
	})
	return slices.CompactFunc(out, func(a, b named) bool { return a.name == b.name })
}

// Published returns the HCAs that Devices publishes, keyed by device name:
// the lookup a driver needs to find the HCA of an allocated device.
func Published(inv hca.Inventory) map[string]hca.HCA {
	p := published(inv)
	m := make(map[string]hca.HCA, len(p))
	for _, n := range p {
		m[n.name] = *n.hca
	}
	return m
}

// Devices maps the usable HCAs of inv to devices, sorted by device name.
// Unusable HCAs are not published. The result is the same for the same HCAs
// in any order.
func Devices(inv hca.Inventory, opts Options) []resourceapi.Device {
	p := published(inv)
	if len(p) == 0 {
		return nil
	}
	m := newMapper(opts.driverName(), inv.NetnsMode)
	devs := make([]resourceapi.Device, len(p))
	for i, n := range p {
		devs[i] = resourceapi.Device{Name: n.name, Attributes: m.deviceAttributes(n.hca, false)}
		if opts.Shares > 0 {
			shared(&devs[i], opts.driverName(), opts.Shares)
			limits(&devs[i], opts.driverName(), opts.HCAHandles, opts.HCAObjects, opts.ClaimMaxPercent)
		}
		if since, ok := opts.TaintedSince[n.name]; ok && n.hca.Problem() != "" {
			devs[i].Taints = []resourceapi.DeviceTaint{portDownTaint(opts.driverName(), n.hca, since)}
		}
		if t, ok := gpuDirectTaint(opts.driverName(), n.hca); ok {
			devs[i].Taints = append(devs[i].Taints, t)
		}
	}
	if opts.LegacyShares > 0 {
		devs = append(devs, legacyDevice(opts.driverName(), len(p), opts.LegacyShares))
		slices.SortFunc(devs, func(a, b resourceapi.Device) int { return cmp.Compare(a.Name, b.Name) })
	}
	return devs
}

// deviceAttributes are an HCA's attributes with legacy=false, which the
// DeviceClasses for HCAs select on: those of its slice, or with all every
// attribute the driver knows (its metadata file).
func (m *mapper) deviceAttributes(h *hca.HCA, all bool) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := m.attributes(h, all)
	attrs[m.legacy] = resourceapi.DeviceAttribute{BoolValue: ptr(false)}
	return attrs
}

// split cuts devices into slices of at most maxDevicesPerSlice, keeping the
// order. No devices is one empty slice: an empty pool, not a missing one.
func split(devs []resourceapi.Device) [][]resourceapi.Device {
	if len(devs) == 0 {
		return [][]resourceapi.Device{nil}
	}
	size := maxDevicesPerSlice
	if slices.ContainsFunc(devs, func(d resourceapi.Device) bool { return len(d.Taints) > 0 }) {
		// Taints are an "advanced feature": such slices hold at most 64.
		size = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
	}
	var out [][]resourceapi.Device
	for c := range slices.Chunk(devs, size) {
		out = append(out, c)
	}
	return out
}

// Resources is what the kubelet plugin publishes for a node: one pool named
// after the node, its devices in slices of at most 128
// (resourceapi.ResourceSliceMaxDevices), in device-name order. The pool
// generation is left to the publisher.
func Resources(nodeName string, inv hca.Inventory, opts Options) resourceslice.DriverResources {
	chunks := split(Devices(inv, opts))
	pool := resourceslice.Pool{Slices: make([]resourceslice.Slice, len(chunks))}
	for i, c := range chunks {
		pool.Slices[i] = resourceslice.Slice{Devices: c}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: pool}}
}

// ResourceSlices renders the slices of Resources as complete objects, for
// printing: named "<node>-<driver, dots as dashes>-<index>", generation 1.
// The publisher names the slices it creates itself; these names only need
// to be valid and stable.
func ResourceSlices(nodeName string, inv hca.Inventory, opts Options) []resourceapi.ResourceSlice {
	driver := opts.driverName()
	chunks := split(Devices(inv, opts))
	out := make([]resourceapi.ResourceSlice, len(chunks))
	for i, c := range chunks {
		out[i] = resourceapi.ResourceSlice{
			TypeMeta: metav1.TypeMeta{
				APIVersion: resourceapi.SchemeGroupVersion.String(),
				Kind:       "ResourceSlice",
			},
			ObjectMeta: metav1.ObjectMeta{Name: sliceName(nodeName, driver, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driver,
				NodeName: &nodeName,
				Pool: resourceapi.ResourcePool{
					Name:               nodeName,
					Generation:         1,
					ResourceSliceCount: int64(len(chunks)),
				},
				Devices: c,
			},
		}
	}
	return out
}

// sliceName is "<node>-<driver>-<i>", the node part shortened when the whole
// would exceed a DNS subdomain's 253 characters.
func sliceName(node, driver string, i int) string {
	suffix := fmt.Sprintf("-%s-%d", strings.ReplaceAll(driver, ".", "-"), i)
	if limit := validation.DNS1123SubdomainMaxLength - len(suffix); len(node) > limit {
		node = strings.TrimRight(node[:limit], ".-")
	}
	return node + suffix
}
