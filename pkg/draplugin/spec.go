package draplugin

// Hot path: what the runtime gets for a resolved claim (CDI spec, result, metadata).

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// writeMetadata writes the device metadata files of claim c when
// they are on, and returns what the kubelet gets for it: the prepared
// devices, the first of each request also naming the request's metadata
// CDI device.
func (s *claimState) writeMetadata(v *view, c checkpoint.Claim) ([]kubeletplugin.Device, error) {
	devs := resultDevices(s.cfg, v, c)
	if !s.cfg.DeviceMetadata {
		return devs, nil
	}
	ids, err := s.meta.write(c, devs)
	if err != nil {
		return nil, err
	}
	for i := range devs {
		for _, r := range devs[i].Requests {
			if id, ok := ids[baseRequest(r)]; ok {
				devs[i].CDIDeviceIDs = append(slices.Clone(devs[i].CDIDeviceIDs), id)
				delete(ids, baseRequest(r))
			}
		}
	}
	return devs, nil
}

// writeSpec (re)writes the CDI spec of a resolved claim. group is the
// set of HCAs the claim's containers see with it, for the aggregate env;
// pods the limits of its pods' cgroups (podlimits.go).
func (s *claimState) writeSpec(v *view, c checkpoint.Claim, group []hca.HCA, pods podTotals) error {
	cfg := s.cfg
	env := false
	family := ""
	var pkey *hca.PKey
	var shm int64
	var devs []cdi.ClaimDevice
	for _, dev := range c.Devices {
		opts := cdi.EditOptions{ManagementDevices: dev.ManagementDevices, Env: dev.Env, HostDevRoot: cfg.HostDevRoot}
		var edits cdispec.ContainerEdits
		var err error
		if h, ok := v.byDevice[dev.Device]; ok {
			edits, err = cdi.DeviceEdits(h, opts)
			// The hostNetwork check before anything is done for the container.
			edits.Hooks = append(cfg.hostNetworkHooks(h.Name), edits.Hooks...)
			// The move first: a container whose HCA cannot join its
			// namespace is refused before anything else is done for it.
			var move *cdispec.Hook
			if err == nil {
				if move, err = s.netnsHook(v, c, dev, h); move != nil {
					edits.Hooks = append(edits.Hooks, move)
				}
			}
			if err == nil && dev.Limits != nil {
				l := share(c, *dev.Limits)
				edits.Hooks = append(edits.Hooks, cdi.LimitHook(cfg.HookPath, h.Name, l.HCAHandles, l.HCAObjects, pods[h.Name]...))
			}
			if hook := cfg.memlockHook(dev.Memlock, h.Name); err == nil && hook != nil {
				edits.Hooks = append(edits.Hooks, hook)
			}
		} else if dev.IBDev == "" && cfg.isLegacy(dev.Device) {
			if usable := v.usable(); len(usable) > 0 {
				edits, err = cdi.NodeEdits(usable, opts)
				names := v.usableNames()
				edits.Hooks = append(cfg.hostNetworkHooks(names...), edits.Hooks...)
				if dev.Limits != nil {
					l := share(c, *dev.Limits)
					for _, name := range names {
						edits.Hooks = append(edits.Hooks, cdi.LimitHook(cfg.HookPath, name, l.HCAHandles, l.HCAObjects, pods[name]...))
					}
				}
				if hook := cfg.memlockHook(dev.Memlock, names...); hook != nil {
					edits.Hooks = append(edits.Hooks, hook)
				}
			} else {
				// Every HCA gone: the spec must still load (CDI refuses a
				// device without edits) and must not name removed nodes.
				edits = cdispec.ContainerEdits{Env: []string{"RDMA_DEVICES="}}
			}
		} else {
			return fmt.Errorf("device %s (%s) is no longer usable on node %s", dev.Device, dev.IBDev, cfg.NodeName)
		}
		if err != nil {
			return err
		}
		env = env || dev.Env
		family, shm = dev.AddressFamily, dev.ShmSizeMiB
		if dev.PKey != nil {
			pkey = &hca.PKey{Value: dev.PKey.Value, Index: dev.PKey.Index}
		}
		devs = append(devs, cdi.ClaimDevice{Name: cdi.DeviceName(c.UID, dev.Device, dev.ShareID), Edits: edits})
	}
	if len(devs) == 0 {
		return s.specs.RemoveClaim(c.UID)
	}
	common := cdi.CommonEdits(v.inv.RDMACM, group, cdi.EditOptions{Env: env, HostDevRoot: cfg.HostDevRoot,
		Network: cdi.Network(c.Network), Family: cdi.AddressFamily(family), PKey: pkey, ShmSizeMiB: shm})
	return s.specs.WriteClaim(c.UID, common, devs)
}

// group returns the HCAs a container using claim c may see together:
// its own, plus those of every claim reserved for one of the same pods. All
// claims of a container then carry identical aggregate variables, so the
// runtime's "last device wins" for env cannot hide an HCA.
func group(cfg *Config, v *view, c checkpoint.Claim, candidates []checkpoint.Claim) []hca.HCA {
	seen := map[string]bool{}
	var group []hca.HCA
	add := func(other checkpoint.Claim) {
		for _, dev := range other.Devices {
			hcas := []hca.HCA{v.byDevice[dev.Device]}
			if cfg.isLegacy(dev.Device) {
				hcas = v.usable()
			}
			for _, h := range hcas {
				if name := devices.DeviceName(h.Name); h.Name != "" && !seen[name] {
					seen[name] = true
					group = append(group, h)
				}
			}
		}
	}
	add(c)
	for _, other := range candidates {
		if other.UID != c.UID && sharesPod(c, other) {
			add(other)
		}
	}
	return group
}

func sharesPod(a, b checkpoint.Claim) bool {
	for _, p := range a.PodUIDs {
		if slices.Contains(b.PodUIDs, p) {
			return true
		}
	}
	return false
}

// resultDevices is what the kubelet hands to the runtime for a
// claim, with each device's metadata when that is on.
func resultDevices(cfg *Config, v *view, c checkpoint.Claim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(c.Devices))
	for _, dev := range c.Devices {
		kd := kubeletplugin.Device{
			Requests:     []string{dev.Request},
			PoolName:     dev.Pool,
			DeviceName:   dev.Device,
			CDIDeviceIDs: dev.CDIDeviceIDs,
		}
		if dev.ShareID != "" {
			id := types.UID(dev.ShareID)
			kd.ShareID = &id
		}
		if cfg.DeviceMetadata {
			kd.Metadata = metadataOf(cfg, v, dev)
		}
		out = append(out, kd)
	}
	return out
}

// metadataOf is the metadata of a prepared device, from the inventory
// it was prepared with.
func metadataOf(cfg *Config, v *view, dev checkpoint.Device) *kubeletplugin.DeviceMetadata {
	opts := devices.Options{DriverName: cfg.DriverName}
	if h, ok := v.byDevice[dev.Device]; ok {
		attrs := devices.Metadata(h, v.inv.NetnsMode, dev.ShareID, opts)
		if k := dev.PKey; k != nil {
			v, i := fmt.Sprintf("0x%04x", k.Value), int64(k.Index)
			attrs[cfg.DriverName+"/pkey"] = resourceapi.DeviceAttribute{StringValue: &v}
			attrs[cfg.DriverName+"/pkeyIndex"] = resourceapi.DeviceAttribute{IntValue: &i}
		}
		if l := dev.Limits; l != nil {
			for name, v := range map[string]int64{"hcaHandleLimit": l.HCAHandles, "hcaObjectLimit": l.HCAObjects} {
				if v > 0 {
					attrs[cfg.DriverName+"/"+name] = resourceapi.DeviceAttribute{IntValue: &v}
				}
			}
		}
		return &kubeletplugin.DeviceMetadata{Attributes: attrs}
	}
	if cfg.isLegacy(dev.Device) {
		return &kubeletplugin.DeviceMetadata{Attributes: devices.LegacyMetadata(v.usable(), opts)}
	}
	return nil
}
