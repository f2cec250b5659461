package draplugin

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	configapi "github.com/rdma-dra/rdma-dra-driver/api/rdma.dra.dev/v1alpha1"
)

// requestConfig is the effective HcaConfig of one allocated request, or why
// there is none, with the memlock its containers get (see memlockOf).
type requestConfig struct {
	cfg     *configapi.HcaConfig
	memlock string
	err     error
}

// requestConfigs returns the effective HcaConfig of each of the driver's
// allocated requests of claim, decoding each opaque config once.
//
// The allocation lists the DeviceClass's configs before the claim's, so
// applying them in order makes the claim win over the class, and a later
// entry win over an earlier one. Configs for other drivers are skipped; a
// config with requests applies only to those (a subrequest "req/sub" is
// matched by its parent "req" too). A claim's config that turns on an
// admin-only field its DeviceClass does not grant is refused, naming the
// field and the class: the claim would otherwise win over the class.
func requestConfigs(cfg *Config, claim *resourceapi.ResourceClaim) map[string]requestConfig {
	driverName := cfg.DriverName
	alloc := claim.Status.Allocation
	if alloc == nil {
		return nil
	}
	configs := alloc.Devices.Config
	decoded := make([]*requestConfig, len(configs))
	decode := func(i int) requestConfig {
		if decoded[i] == nil {
			cfg, err := configapi.Decode(configs[i].Opaque.Parameters.Raw)
			if err != nil {
				err = fmt.Errorf("status.allocation.devices.config[%d] (%s): %w", i, sourceName(configs[i].Source), err)
			}
			decoded[i] = &requestConfig{cfg: cfg, err: err}
		}
		return *decoded[i]
	}
	out := map[string]requestConfig{}
	for _, r := range alloc.Devices.Results {
		if _, done := out[r.Request]; done || r.Driver != driverName {
			continue
		}
		out[r.Request] = effectiveConfig(cfg, claim, r.Request, decode)
	}
	return out
}

// effectiveConfig applies the configs that apply to request: the
// DeviceClass's, then the claim's, checking the claim's against the grant.
func effectiveConfig(cfg *Config, claim *resourceapi.ResourceClaim, request string, decode func(int) requestConfig) requestConfig {
	driverName := cfg.DriverName
	parent, _, _ := strings.Cut(request, "/")
	var class, own []*configapi.HcaConfig
	for _, src := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
		for i, c := range claim.Status.Allocation.Devices.Config {
			if c.Source != src || c.Opaque == nil || c.Opaque.Driver != driverName {
				continue
			}
			if len(c.Requests) > 0 && !slices.Contains(c.Requests, request) && !slices.Contains(c.Requests, parent) {
				continue
			}
			d := decode(i)
			if d.err != nil {
				return d
			}
			if src == resourceapi.AllocationConfigSourceClass {
				class = append(class, d.cfg)
			} else {
				own = append(own, d.cfg)
			}
		}
	}
	grant := configapi.Merge(class...)
	for _, c := range own {
		if fields := c.BeyondGrant(grant); len(fields) > 0 {
			return requestConfig{err: fmt.Errorf("request %s: the claim's config sets %s, which only a DeviceClass's config may turn on, and DeviceClass %s does not; "+
				"ask the cluster's admin for a DeviceClass that grants it", request, strings.Join(quoteAll(fields, ": true"), " and "), className(claim, request))}
		}
	}
	memlock, err := cfg.memlockOf(request, className(claim, request), grant.Memlock, configapi.Merge(own...).Memlock)
	if err != nil {
		return requestConfig{err: err}
	}
	return requestConfig{cfg: configapi.Merge(append(class, own...)...), memlock: memlock}
}

func sourceName(s resourceapi.AllocationConfigSource) string {
	if s == resourceapi.AllocationConfigSourceClass {
		return "from the DeviceClass"
	}
	return "from the claim"
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
