package driver

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
	parent, _, _ := strings.Cut(request, "/")
	var chain []*configapi.HcaConfig
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
				return nil, fmt.Errorf("status.allocation.devices.config[%d] (%s): %w", i, sourceName(c.Source), err)
			}
			chain = append(chain, cfg)
		}
	}
	return configapi.Merge(chain...), nil
}

func sourceName(s resourceapi.AllocationConfigSource) string {
	if s == resourceapi.AllocationConfigSourceClass {
		return "from the DeviceClass"
	}
	return "from the claim"
}
