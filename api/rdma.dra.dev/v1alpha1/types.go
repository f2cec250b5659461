package v1alpha1

import (
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HcaConfig is the per-request configuration of the devices the driver
// prepares. Every field is optional; a nil field means "as configured
// earlier", and in the end the default (see Merge).
//
// TypeMeta is the apimachinery type rather than a local copy: the driver
// links apimachinery anyway, and it keeps the type registrable in a
// runtime.Scheme (say, for a validating webhook) without changing its shape.
type HcaConfig struct {
	metav1.TypeMeta `json:",inline"`

	// ManagementDevices also exposes every umadN and issmN of the HCA's
	// ports, for MAD tools such as ibstat or perfquery. Default false: they
	// allow sending management datagrams to the fabric.
	ManagementDevices *bool `json:"managementDevices,omitempty"`

	// Env sets the RDMA_DEVICES, NCCL_IB_HCA and UCX_NET_DEVICES hints in
	// the container. Default true.
	Env *bool `json:"env,omitempty"`
}

// DefaultHcaConfig returns the defaults, with every field set and the
// TypeMeta filled in. Each call returns a new value the caller may change.
func DefaultHcaConfig() *HcaConfig {
	return &HcaConfig{
		TypeMeta:          metav1.TypeMeta{APIVersion: APIVersion, Kind: Kind},
		ManagementDevices: ptr(false),
		Env:               ptr(true),
	}
}

// Validate reports what Decode would reject in a config built in code: a
// missing or wrong apiVersion or kind. Every combination of the fields
// themselves is valid.
func (c *HcaConfig) Validate() error {
	if c == nil {
		return errors.New("HcaConfig: no config")
	}
	if err := checkTypeMeta("apiVersion", c.APIVersion, APIVersion); err != nil {
		return err
	}
	return checkTypeMeta("kind", c.Kind, Kind)
}

func checkTypeMeta(field, got, want string) error {
	switch got {
	case want:
		return nil
	case "":
		return fmt.Errorf("%s: missing; want %q", field, want)
	default:
		return fmt.Errorf("%s: want %q, got %q", field, want, got)
	}
}

// Merge returns the effective config of a chain of configs: the defaults,
// then each config in order, a set field replacing the earlier value and a
// nil field (or a nil config) leaving it. Pass the DeviceClass's configs
// before the claim's so the claim wins.
//
// The result has every field set and shares no pointer with the inputs.
func Merge(configs ...*HcaConfig) *HcaConfig {
	out := DefaultHcaConfig()
	for _, c := range configs {
		if c == nil {
			continue
		}
		if c.ManagementDevices != nil {
			out.ManagementDevices = ptr(*c.ManagementDevices)
		}
		if c.Env != nil {
			out.Env = ptr(*c.Env)
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }
