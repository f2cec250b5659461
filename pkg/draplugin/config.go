package draplugin

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	configapi "github.com/rdma-dra/rdma-dra-driver/api/rdma.dra.dev/v1alpha1"
)

// configFor returns the effective HcaConfig of one allocated request.
//
// The allocation lists the DeviceClass's configs before the claim's, so
// applying them in order makes the claim win over the class, and a later
// entry win over an earlier one. Configs for other drivers are skipped; a
// config with requests applies only to those (a subrequest "req/sub" is
// matched by its parent "req" too).
func configFor(driverName string, configs []resourceapi.DeviceAllocationConfiguration, request string) (*configapi.HcaConfig, error) {
	class, claim, err := configChain(driverName, configs, request)
	if err != nil {
		return nil, err
	}
	return configapi.Merge(append(class, claim...)...), nil
}

// configChain decodes the configs of one request that apply to it, the
// DeviceClass's and the claim's apart, each in allocation order.
func configChain(driverName string, configs []resourceapi.DeviceAllocationConfiguration, request string) (class, claim []*configapi.HcaConfig, err error) {
	parent, _, _ := strings.Cut(request, "/")
	for _, src := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
		for i, c := range configs {
			if c.Source != src || c.Opaque == nil || c.Opaque.Driver != driverName {
				continue
			}
			if len(c.Requests) > 0 && !slices.Contains(c.Requests, request) && !slices.Contains(c.Requests, parent) {
				continue
			}
			cfg, err := configapi.Decode(c.Opaque.Parameters.Raw)
			if err != nil {
				return nil, nil, fmt.Errorf("status.allocation.devices.config[%d] (%s): %w", i, sourceName(c.Source), err)
			}
			if src == resourceapi.AllocationConfigSourceClass {
				class = append(class, cfg)
			} else {
				claim = append(claim, cfg)
			}
		}
	}
	return class, claim, nil
}

func sourceName(s resourceapi.AllocationConfigSource) string {
	if s == resourceapi.AllocationConfigSourceClass {
		return "from the DeviceClass"
	}
	return "from the claim"
}
