package draplugin

// Resolving a claim: its allocation, the node's policy, its config and the
// inventory of one view become the record of what to prepare. Pure: no
// I/O, no lock.

import (
	"errors"
	"fmt"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	configapi "github.com/rdma-dra/rdma-dra-driver/api/rdma.dra.dev/v1alpha1"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// resolve turns a claim's allocation into the record of what to prepare,
// checking the policy, the config and the inventory of v.
func resolve(cfg *Config, v *view, claim *resourceapi.ResourceClaim, facts claimFacts, bootID string) (checkpoint.Claim, error) {
	c := checkpoint.Claim{
		UID:        string(claim.UID),
		Namespace:  claim.Namespace,
		Name:       claim.Name,
		BootID:     bootID,
		PreparedAt: time.Now().UTC(),
		// Set when a ResourceClaimTemplate made the claim.
		PodClaimName: claim.Annotations[resourceapi.PodResourceClaimAnnotation],
	}
	if c.PodClaimName != "" {
		if err := checkPodClaimName(c.PodClaimName); err != nil {
			return c, err
		}
	}
	alloc := claim.Status.Allocation
	if alloc == nil {
		return c, errors.New("it is not allocated")
	}
	for _, ref := range claim.Status.ReservedFor {
		if ref.APIGroup == "" && ref.Resource == "pods" {
			c.PodUIDs = append(c.PodUIDs, string(ref.UID))
		}
	}
	slices.Sort(c.PodUIDs)
	if facts.networkErr != nil {
		return c, facts.networkErr
	}
	c.Network = string(facts.network)

	for _, r := range alloc.Devices.Results {
		if r.Driver != cfg.DriverName {
			continue
		}
		dev, err := resolveDevice(cfg, v, c, r, facts)
		if err != nil {
			return c, err
		}
		if len(c.Devices) > 0 && !samePKey(c.Devices[0].PKey, dev.PKey) {
			return c, fmt.Errorf("requests %s and %s need different P_Key settings (%s, %s), but a container gets one NCCL_IB_PKEY", c.Devices[0].Request, r.Request, pkeyName(c.Devices[0].PKey), pkeyName(dev.PKey))
		}
		if len(c.Devices) > 0 && c.Devices[0].ShmSizeMiB != dev.ShmSizeMiB {
			return c, fmt.Errorf("requests %s and %s ask for different shmSizeMiB (%d, %d), but a container has one /dev/shm", c.Devices[0].Request, r.Request, c.Devices[0].ShmSizeMiB, dev.ShmSizeMiB)
		}
		if len(c.Devices) > 0 && c.Devices[0].Memlock != dev.Memlock {
			return c, fmt.Errorf("requests %s and %s ask for different memlock (%s, %s), but a container's process has one RLIMIT_MEMLOCK", c.Devices[0].Request, r.Request, c.Devices[0].Memlock, dev.Memlock)
		}
		if len(c.Devices) > 0 && c.Devices[0].AddressFamily != dev.AddressFamily {
			return c, fmt.Errorf("requests %s and %s ask for different addressFamily (%s, %s), but a container gets one set of NCCL/UCX GID hints", c.Devices[0].Request, r.Request, familyName(c.Devices[0].AddressFamily), familyName(dev.AddressFamily))
		}
		c.Devices = append(c.Devices, dev)
	}
	return c, checkShares(c)
}

// resolveDevice is the record of one allocated device of claim c.
func resolveDevice(cfg *Config, v *view, c checkpoint.Claim, r resourceapi.DeviceRequestAllocationResult, facts claimFacts) (checkpoint.Device, error) {
	rc := facts.configs[r.Request]
	if rc.err != nil {
		return checkpoint.Device{}, rc.err
	}
	hcaCfg := rc.cfg
	h, err := lookup(cfg, v, r)
	if err != nil {
		return checkpoint.Device{}, err
	}
	dev := checkpoint.Device{
		Request:           r.Request,
		Pool:              r.Pool,
		Device:            r.Device,
		IBDev:             h.Name,
		AdminAccess:       r.AdminAccess != nil && *r.AdminAccess,
		ManagementDevices: *hcaCfg.ManagementDevices,
		Env:               *hcaCfg.Env,
		Process:           checkpoint.Process{Memlock: rc.memlock},
	}
	if hcaCfg.ShmSizeMiB != nil {
		dev.ShmSizeMiB = *hcaCfg.ShmSizeMiB
	}
	if dev.Limits, err = cfg.limits(r); err != nil {
		return dev, err
	}
	if hcaCfg.PKey != nil {
		if dev.PKey, err = pkeyOf(h, *hcaCfg.PKey, facts.pkeys); err != nil {
			return dev, err
		}
	}
	if f := *hcaCfg.AddressFamily; f != configapi.AddressFamilyAuto {
		dev.AddressFamily = string(f)
	}
	if r.ShareID != nil {
		dev.ShareID = string(*r.ShareID)
	}
	dev.MoveNetdev = *hcaCfg.MoveNetdev
	if err := checkMove(cfg, v, c, dev); err != nil {
		return dev, err
	}
	if moves(v, c, dev) {
		if dev.MoveNetdev {
			err, checked := facts.netdevs[h.Name]
			if !checked {
				err = fmt.Errorf("HCA %s: %w", h.Name, errNoUplinkFacts)
			}
			if err != nil {
				return dev, fmt.Errorf("device %s: %w", r.Device, err)
			}
		}
		dev.MovedHCA = checkpoint.SnapshotHCA(h)
	}
	dev.CDIDeviceIDs = []string{cdi.QualifiedName(cdi.DeviceName(c.UID, r.Device, dev.ShareID))}
	return dev, nil
}

// lookup finds the HCA of an allocation result in the inventory.
func lookup(cfg *Config, v *view, r resourceapi.DeviceRequestAllocationResult) (hca.HCA, error) {
	if r.Pool != cfg.NodeName {
		return hca.HCA{}, fmt.Errorf("device %s is from pool %q, but this node's pool is %q", r.Device, r.Pool, cfg.NodeName)
	}
	if h, ok := v.byDevice[r.Device]; ok {
		return h, nil
	}
	if cfg.isLegacy(r.Device) {
		if len(v.byDevice) == 0 {
			return hca.HCA{}, fmt.Errorf("device %s stands for the node's HCAs, but none is usable on node %s", r.Device, cfg.NodeName)
		}
		return hca.HCA{}, nil
	}
	for _, h := range v.inv.HCAs {
		if devices.DeviceName(h.Name) == r.Device {
			return h, fmt.Errorf("device %s (%s) is not usable any more: %s", r.Device, h.Name, h.UnusableReason)
		}
	}
	return hca.HCA{}, fmt.Errorf("device %s is no longer on node %s (HCA removed, or its driver unloaded?)", r.Device, cfg.NodeName)
}

// holderError refuses c when another claim, of cp or of pending, holds one
// of its devices. Two admin-access claims may share a device; nothing else
// may (sharing modes come with share IDs, which the allocator hands out
// per claim).
func holderError(c checkpoint.Claim, cp checkpoint.Checkpoint, pending []checkpoint.Claim) error {
	for _, dev := range c.Devices {
		if holder := holderOf(dev, c.UID, cp, pending); holder != "" {
			return fmt.Errorf("device %s (%s) is already prepared for claim %s; refusing to hand one HCA to two claims", dev.Device, dev.IBDev, holder)
		}
	}
	return nil
}

// holderOf names another claim that holds dev, or "".
func holderOf(dev checkpoint.Device, self string, cp checkpoint.Checkpoint, pending []checkpoint.Claim) string {
	check := func(c checkpoint.Claim) bool {
		if c.UID == self {
			return false
		}
		for _, other := range c.Devices {
			if other.Pool != dev.Pool || !overlap(other, dev) {
				continue
			}
			if other.AdminAccess && dev.AdminAccess {
				continue
			}
			if other.ShareID != "" && dev.ShareID != "" && other.ShareID != dev.ShareID {
				continue
			}
			return true
		}
		return false
	}
	for _, uid := range sortedKeys(cp.Claims) {
		if c := cp.Claims[uid]; check(c) {
			return c.Namespace + "/" + c.Name
		}
	}
	for _, c := range pending {
		if check(c) {
			return c.Namespace + "/" + c.Name
		}
	}
	return ""
}

// overlap reports whether two prepared devices use a common HCA. The legacy
// device (no IBDev) uses them all.
func overlap(a, b checkpoint.Device) bool {
	return a.Device == b.Device || a.IBDev == "" || b.IBDev == "" || a.IBDev == b.IBDev
}
