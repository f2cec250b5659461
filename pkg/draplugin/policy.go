package draplugin

// The admin's settings and the hostNetwork switch, as prepare applies them
// (docs/security.md): what a claim may ask for in its config (config.go),
// the RDMA cgroup limits a claim on a shared HCA gets, and the
// container-start check every device carries while non-hostNetwork RDMA
// is off.

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/rdma-dra/rdma-dra-driver/api/rdma.dra.dev/v1alpha1"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
)

// limits reads the RDMA cgroup capacities an allocation consumed.
func (cfg *Config) limits(r resourceapi.DeviceRequestAllocationResult) (*checkpoint.Limits, error) {
	var l checkpoint.Limits
	for name, dst := range map[string]*int64{devices.CapacityHCAHandles: &l.HCAHandles, devices.CapacityHCAObjects: &l.HCAObjects} {
		q, ok := r.ConsumedCapacity[resourceapi.QualifiedName(cfg.DriverName+"/"+name)]
		if !ok {
			continue
		}
		v, exact := q.AsInt64()
		if !exact || v < 0 {
			return nil, fmt.Errorf("device %s: consumed capacity %s is %s, want a whole number >= 0", r.Device, name, q.String())
		}
		*dst = v
	}
	if err := cfg.limitPolicy(r, &l); err != nil {
		return nil, err
	}
	if l == (checkpoint.Limits{}) {
		return nil, nil
	}
	if cfg.HookPath == "" {
		return nil, fmt.Errorf("device %s: the claim consumed RDMA cgroup limits (%d handles, %d objects), but this node sets none (no rdma cgroup controller, or no hook)", r.Device, l.HCAHandles, l.HCAObjects)
	}
	return &l, nil
}

// limitPolicy applies the node's defaults to the limits l a claim consumed
// on a shared device, where this node publishes the capacities (a kernel
// with the rdma cgroup controller, and the hook): a capacity the claim left
// at zero gets its default (never above the per-claim ceiling), or refuses
// the claim under Limits.Require; one above the ceiling is refused (the
// scheduler should have: a slice published before the ceiling was set).
// Exclusive devices are not limited: nobody shares them.
func (cfg *Config) limitPolicy(r resourceapi.DeviceRequestAllocationResult, l *checkpoint.Limits) error {
	if r.ShareID == nil {
		return nil
	}
	for _, c := range []struct {
		name       string
		published  int64
		def        int64
		value      *int64
		limitsFlag string
	}{
		{devices.CapacityHCAHandles, cfg.Limits.Handles, cfg.Limits.DefaultHandles, &l.HCAHandles, "--default-hca-handles"},
		{devices.CapacityHCAObjects, cfg.Limits.Objects, cfg.Limits.DefaultObjects, &l.HCAObjects, "--default-hca-objects"},
	} {
		if c.published <= 0 {
			continue
		}
		ceiling := devices.ClaimCeiling(c.published, cfg.Limits.ClaimMaxPercent)
		if *c.value > ceiling {
			return fmt.Errorf("device %s: the claim consumed %s/%s %d, more than the %d one claim may ask of this HCA (--claim-max-percent=%d, Helm value hook.claimMaxPercent)",
				r.Device, cfg.DriverName, c.name, *c.value, ceiling, cfg.Limits.ClaimMaxPercent)
		}
		if *c.value > 0 {
			continue
		}
		if c.def > 0 {
			*c.value = min(c.def, ceiling)
			continue
		}
		if cfg.Limits.Require {
			return fmt.Errorf("device %s: the claim asks for no %s/%s, and this node requires RDMA cgroup limits on shared HCAs (--require-hca-limits, "+
				"Helm value hook.requireLimits) and sets no default (%s): ask for that capacity in the claim's request", r.Device, cfg.DriverName, c.name, c.limitsFlag)
		}
	}
	return nil
}

// hostNetworkHooks is the container-start check of the hostNetwork switch
// for a device that gives a container ibdevs, or none where every pod may
// use RDMA (or without a hook, where only prepare checks).
func (cfg *Config) hostNetworkHooks(ibdevs ...string) []*cdispec.Hook {
	if cfg.AllowNonHostNetwork || cfg.HookPath == "" || len(ibdevs) == 0 {
		return nil
	}
	return []*cdispec.Hook{cdi.HostNetworkHook(cfg.HookPath, ibdevs)}
}

// memlockOff is the checkpoint's record of a device whose containers get
// no memlock hook; a record without a value (an older release's) means
// the node's --memlock.
const memlockOff = "off"

// memlockOf decides the RLIMIT_MEMLOCK the hook gives a request's
// containers, as the hook takes it ("unlimited" or a byte count), or
// memlockOff. The ceiling is the DeviceClass's memlock (class), else the
// node's --memlock; the claim's own (own) may ask for less, never more,
// nor for any where the node gives none.
func (cfg *Config) memlockOf(request, className string, class, own *string) (string, error) {
	node := cfg.Memlock
	if cfg.HookPath == "" {
		node = ""
	}
	const off = "this node gives containers no memlock (--memlock=off, Helm value memlock: off, or no --hook-path)"
	ceiling, from := node, "this node's --memlock"
	if class != nil {
		if node == "" {
			return "", fmt.Errorf("request %s: DeviceClass %s sets memlock: %s, but %s; remove memlock from the class or turn the node's memlock on", request, className, *class, off)
		}
		ceiling, from = *class, "DeviceClass "+className+"'s memlock"
	}
	want := ceiling
	if own != nil {
		if ceiling == "" {
			return "", fmt.Errorf("request %s: the claim's config sets memlock: %s, but %s", request, *own, off)
		}
		asked, err := configapi.ParseMemlock(*own)
		if err != nil {
			return "", fmt.Errorf("request %s: memlock: %w", request, err)
		}
		limit, err := configapi.ParseMemlock(ceiling)
		if err != nil {
			return "", fmt.Errorf("request %s: %s: %w", request, from, err)
		}
		if asked.Exceeds(limit) {
			return "", fmt.Errorf("request %s: the claim's config sets memlock: %s, more than its ceiling %s (%s); a claim may only ask for less",
				request, *own, humanMemlock(limit), from)
		}
		want = *own
	}
	if want == "" {
		return memlockOff, nil
	}
	m, err := configapi.ParseMemlock(want)
	if err != nil {
		return "", fmt.Errorf("request %s: %s: %w", request, from, err)
	}
	return m.String(), nil
}

// humanMemlock writes a memlock value for a person: unlimited, or a
// binary quantity ("64Mi").
func humanMemlock(m configapi.Memlock) string {
	if m.Unlimited {
		return configapi.MemlockUnlimited
	}
	return resource.NewQuantity(m.Bytes, resource.BinarySI).String()
}

// memlockHook is the memlock hook of a device that gives a container
// ibdevs, with the value recorded at prepare (empty: an older release's
// record, which means the node's --memlock), or nil for none. Both are
// already as the hook takes them (memlockOf, Config.validate).
func (cfg *Config) memlockHook(recorded string, ibdevs ...string) *cdispec.Hook {
	v := recorded
	if v == "" {
		v = cfg.Memlock
	}
	if v == "" || v == memlockOff || cfg.HookPath == "" || len(ibdevs) == 0 {
		return nil
	}
	return cdi.MemlockHook(cfg.HookPath, ibdevs, v)
}
