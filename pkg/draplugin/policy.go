package draplugin

// The admin's settings and the hostNetwork switch, as prepare applies them
// (docs/security.md): what a claim may ask for in its config, the RDMA
// cgroup limits a claim on a shared HCA gets, and the container-start
// check every device carries while non-hostNetwork RDMA is off.

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/rdma-dra/rdma-dra-driver/api/rdma.dra.dev/v1alpha1"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
)

// claimConfig is the effective HcaConfig of one allocated request. A
// claim's config that turns on an admin-only field its DeviceClass does not
// grant is refused, naming the field and the class: the claim would
// otherwise win over the class (configFor's order).
func (d *Driver) claimConfig(claim *resourceapi.ResourceClaim, request string) (*configapi.HcaConfig, error) {
	configs := claim.Status.Allocation.Devices.Config
	class, own, err := configChain(d.cfg.DriverName, configs, request)
	if err != nil {
		return nil, err
	}
	grant := configapi.Merge(class...)
	for _, c := range own {
		if fields := c.BeyondGrant(grant); len(fields) > 0 {
			return nil, fmt.Errorf("request %s: the claim's config sets %s, which only a DeviceClass's config may turn on, and DeviceClass %s does not; "+
				"ask the cluster's admin for a DeviceClass that grants it", request, strings.Join(quoteAll(fields, ": true"), " and "), className(claim, request))
		}
	}
	return configapi.Merge(append(class, own...)...), nil
}

func quoteAll(fields []string, suffix string) []string {
	out := make([]string, len(fields))
	for i, f := range fields {
		out[i] = f + suffix
	}
	return out
}

// className is the DeviceClass a request (or "request/subrequest") asked
// for, quoted, or a description when the claim's spec does not say.
func className(claim *resourceapi.ResourceClaim, request string) string {
	parent, sub, _ := strings.Cut(request, "/")
	for _, r := range claim.Spec.Devices.Requests {
		if r.Name != parent {
			continue
		}
		if sub == "" && r.Exactly != nil {
			return fmt.Sprintf("%q", r.Exactly.DeviceClassName)
		}
		for _, s := range r.FirstAvailable {
			if s.Name == sub {
				return fmt.Sprintf("%q", s.DeviceClassName)
			}
		}
	}
	return "(the request's class, not in the claim's spec)"
}

// limitPolicy applies the node's defaults to the limits l a claim consumed
// on a shared device, where this node publishes the capacities (a kernel
// with the rdma cgroup controller, and the hook): a capacity the claim left
// at zero gets its default, or refuses the claim under RequireHCALimits.
// Exclusive devices are not limited: nobody shares them.
func (d *Driver) limitPolicy(r resourceapi.DeviceRequestAllocationResult, l *checkpoint.Limits) error {
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
		{devices.CapacityHCAHandles, d.cfg.HCAHandles, d.cfg.DefaultHCAHandles, &l.HCAHandles, "--default-hca-handles"},
		{devices.CapacityHCAObjects, d.cfg.HCAObjects, d.cfg.DefaultHCAObjects, &l.HCAObjects, "--default-hca-objects"},
	} {
		if c.published <= 0 || *c.value > 0 {
			continue
		}
		if c.def > 0 {
			*c.value = min(c.def, c.published)
			continue
		}
		if d.cfg.RequireHCALimits {
			return fmt.Errorf("device %s: the claim asks for no %s/%s, and this node requires RDMA cgroup limits on shared HCAs (--require-hca-limits, "+
				"Helm value hook.requireLimits) and sets no default (%s): ask for that capacity in the claim's request", r.Device, d.cfg.DriverName, c.name, c.limitsFlag)
		}
	}
	return nil
}

// hostNetworkHooks is the container-start check of the hostNetwork switch
// for a device that gives a container ibdevs, or none where every pod may
// use RDMA (or without a hook, where only prepare checks).
func (d *Driver) hostNetworkHooks(ibdevs ...string) []*cdispec.Hook {
	if d.cfg.AllowNonHostNetwork || d.cfg.HookPath == "" || len(ibdevs) == 0 {
		return nil
	}
	return []*cdispec.Hook{cdi.HostNetworkHook(d.cfg.HookPath, ibdevs)}
}
