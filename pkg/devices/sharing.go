package devices

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

const (
	// AttrLegacy is true only on LegacyDeviceName; DeviceClasses for HCAs
	// select legacy == false, the legacy class legacy == true.
	AttrLegacy = "legacy"
	// AttrHCAs is the number of HCAs the legacy device stands for.
	AttrHCAs = "hcas"
	// CapacityShares is the consumable capacity of shared devices.
	CapacityShares = "shares"
	// CapacityHCAHandles and CapacityHCAObjects are the RDMA cgroup limits
	// a claim on a shared HCA may ask for (rdma.max hca_handle, hca_object).
	CapacityHCAHandles = "hcaHandles"
	CapacityHCAObjects = "hcaObjects"
	// LegacyDeviceName cannot collide with an HCA: ibdev names never
	// start with "legacy-".
	LegacyDeviceName = "legacy-rdma-hca"
)

func ptr[T any](v T) *T { return &v }

// shared turns a device into a shared one: many claims may hold it, each
// consuming one share unless it asks for more.
func shared(d *resourceapi.Device, driver string, shares int64) {
	d.AllowMultipleAllocations = ptr(true)
	d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		resourceapi.QualifiedName(driver + "/" + CapacityShares): {
			Value: *resource.NewQuantity(shares, resource.DecimalSI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: resource.NewQuantity(1, resource.DecimalSI),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  resource.NewQuantity(1, resource.DecimalSI),
					Step: resource.NewQuantity(1, resource.DecimalSI),
				},
			},
		},
	}
}

// ClaimCeiling is the most of a capacity one claim may consume: percent of
// it (at least 1), or all of it for 0 or 100 and more.
func ClaimCeiling(capacity, percent int64) int64 {
	if percent <= 0 || percent >= 100 {
		return capacity
	}
	return max(capacity*percent/100, 1)
}

// limits adds the RDMA cgroup capacities to a shared device: by default a
// claim consumes (and is limited to) nothing; it may ask for 0 up to
// ClaimCeiling (all, unless maxPercent caps it).
func limits(d *resourceapi.Device, driver string, handles, objects, maxPercent int64) {
	for name, total := range map[string]int64{CapacityHCAHandles: handles, CapacityHCAObjects: objects} {
		if total <= 0 {
			continue
		}
		d.Capacity[resourceapi.QualifiedName(driver+"/"+name)] = resourceapi.DeviceCapacity{
			Value: *resource.NewQuantity(total, resource.DecimalSI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: resource.NewQuantity(0, resource.DecimalSI),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  resource.NewQuantity(0, resource.DecimalSI),
					Max:  resource.NewQuantity(ClaimCeiling(total, maxPercent), resource.DecimalSI),
					Step: resource.NewQuantity(1, resource.DecimalSI),
				},
			},
		}
	}
}

// legacyDevice stands for every usable HCA of the node (rdma/hca: 1 gets
// them all, shared with the node's other rdma/hca pods).
func legacyDevice(driver string, hcas int, shares int64) resourceapi.Device {
	d := resourceapi.Device{
		Name: LegacyDeviceName,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			resourceapi.QualifiedName(driver + "/" + AttrLegacy): {BoolValue: ptr(true)},
			resourceapi.QualifiedName(driver + "/" + AttrHCAs):   {IntValue: ptr(int64(hcas))},
		},
	}
	shared(&d, driver, shares)
	return d
}

// TaintPortDown is the key of the taint on an HCA whose port is not ACTIVE.
const TaintPortDown = "port-down"

// TaintGPUDirectNotReady is the key of the taint on an HCA whose GPU
// peer-to-peer DMA cannot turn in the PCIe switch it shares with its GPUs
// (hca.GPUDirectNotReady): the HCA works, GPUDirect RDMA through it does
// not (or crawls through the root port). Its value is the cause
// (hca.GPUDirectCause*). A claim that does not need GPUDirect tolerates it.
const TaintGPUDirectNotReady = "gpudirect-not-ready"

// gpuDirectTaint is NoSchedule with no TimeAdded: the apiserver sets it,
// and the ResourceSlice controller keeps the stored one while the taint is
// unchanged, so a publish does not move it.
func gpuDirectTaint(driver string, h *hca.HCA) (resourceapi.DeviceTaint, bool) {
	if h.DataPath == nil || h.DataPath.GPUDirect != hca.GPUDirectNotReady {
		return resourceapi.DeviceTaint{}, false
	}
	return resourceapi.DeviceTaint{
		Key:    driver + "/" + TaintGPUDirectNotReady,
		Value:  h.DataPath.GPUDirectCause,
		Effect: resourceapi.DeviceTaintEffectNoSchedule,
	}, true
}

func portDownTaint(driver string, h *hca.HCA, since metav1.Time) resourceapi.DeviceTaint {
	value := "unknown"
	for _, p := range h.Ports {
		if p.State != "ACTIVE" && p.State != "" {
			value = p.State
			break
		}
	}
	return resourceapi.DeviceTaint{
		Key:       driver + "/" + TaintPortDown,
		Value:     value,
		Effect:    resourceapi.DeviceTaintEffectNoSchedule,
		TimeAdded: &since,
	}
}
