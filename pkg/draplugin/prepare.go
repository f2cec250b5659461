package draplugin

// The hot path: everything here runs while a pod waits to start.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	configapi "github.com/rdma-dra/rdma-dra-driver/api/rdma.dra.dev/v1alpha1"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// HostNetworkHint tells an operator how to allow non-hostNetwork pods.
const HostNetworkHint = "start the driver with --allow-non-host-network (Helm value allowNonHostNetwork=true) to allow it"

// PrepareResourceClaims writes one CDI spec per claim and records the claims
// in the checkpoint with a single write.
//
// It must be idempotent because the kubelet asks again after its own
// restart: an already prepared claim is resolved again (its allocation never
// changes) and its spec rewritten, since /var/run/cdi may have been emptied.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	if len(claims) == 0 {
		return map[types.UID]kubeletplugin.PrepareResult{}, nil // a liveness probe
	}
	start := time.Now()
	facts := d.gatherFacts(ctx, claims)
	d.mu.Lock()
	if err := d.refuseWhileDraining(ctx); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()

	cp, err := d.store.Load()
	if err != nil {
		return nil, fmt.Errorf("reading the checkpoint: %w", err)
	}
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var resolved []checkpoint.Claim
	for i, claim := range claims {
		c, err := d.resolveLocked(claim, cp, resolved, facts[i])
		if err != nil {
			results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)}
			continue
		}
		resolved = append(resolved, c)
	}

	candidates := append(slices.Collect(maps.Values(cp.Claims)), resolved...)
	var written []checkpoint.Claim
	devs := map[string][]kubeletplugin.Device{}
	for _, c := range resolved {
		err := d.writeSpecLocked(c, d.groupLocked(c, candidates))
		if err == nil {
			devs[c.UID], err = d.writeMetadataLocked(c)
		}
		if err != nil {
			d.undoLocked(c, cp)
			results[types.UID(c.UID)] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
			continue
		}
		written = append(written, c)
	}

	err = d.store.Update(func(cp *checkpoint.Checkpoint) error {
		for _, c := range written {
			cp.Claims[c.UID] = c
		}
		return nil
	})
	for _, c := range written {
		if err != nil {
			d.undoLocked(c, cp)
			results[types.UID(c.UID)] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: recording it in the checkpoint: %w", c.Namespace, c.Name, err)}
			continue
		}
		results[types.UID(c.UID)] = kubeletplugin.PrepareResult{Devices: devs[c.UID]}
		d.statusPreparedLocked(c)
		if _, repeat := cp.Claims[c.UID]; repeat {
			d.metrics.prepareRepeated.Inc()
			klog.FromContext(ctx).V(2).Info("Prepared a claim again (already in the checkpoint)", "claim", c.Namespace+"/"+c.Name, "claimUID", c.UID)
		}
	}
	d.metrics.observe(d.metrics.prepareTotal, d.metrics.prepareDuration, results, start)
	return results, nil
}

// undoLocked removes the files of a claim that failed: without a record,
// unprepare could not clean up. An earlier, recorded prepare keeps them.
func (d *Driver) undoLocked(c checkpoint.Claim, cp checkpoint.Checkpoint) {
	if _, known := cp.Claims[c.UID]; known {
		return
	}
	_ = d.specs.RemoveClaim(c.UID)
	if d.meta.dataDir != "" {
		_ = d.meta.remove(c.Namespace, c.Name, c.UID, sameNameClaim(cp, c.Namespace, c.Name, c.UID))
	}
}

// sameNameClaim reports whether cp holds a claim namespace/name other than
// uid (a claim deleted and made again): the metadata directory, named by
// namespace and name, is then that claim's.
func sameNameClaim(cp checkpoint.Checkpoint, namespace, name, uid string) bool {
	for _, c := range cp.Claims {
		if c.Namespace == namespace && c.Name == name && c.UID != uid {
			return true
		}
	}
	return false
}

// resolveLocked turns a claim's allocation into the record of what to
// prepare, checking the policy, the config and the inventory.
func (d *Driver) resolveLocked(claim *resourceapi.ResourceClaim, cp checkpoint.Checkpoint, pending []checkpoint.Claim, facts claimFacts) (checkpoint.Claim, error) {
	c := checkpoint.Claim{
		UID:        string(claim.UID),
		Namespace:  claim.Namespace,
		Name:       claim.Name,
		BootID:     d.bootID,
		PreparedAt: time.Now().UTC(),
		// Set when a ResourceClaimTemplate made the claim.
		PodClaimName: claim.Annotations[resourceapi.PodResourceClaimAnnotation],
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
	if facts.exclusive != d.exclusiveLocked() {
		return c, errors.New("the node's RDMA netns mode changed while the claim's pods were looked up; the kubelet retries the prepare")
	}
	c.Network = string(facts.network)

	for _, r := range alloc.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		cfg, err := d.claimConfig(claim, r.Request)
		if err != nil {
			return c, err
		}
		h, err := d.lookupLocked(r)
		if err != nil {
			return c, err
		}
		dev := checkpoint.Device{
			Request:           r.Request,
			Pool:              r.Pool,
			Device:            r.Device,
			IBDev:             h.Name,
			AdminAccess:       r.AdminAccess != nil && *r.AdminAccess,
			ManagementDevices: *cfg.ManagementDevices,
			Env:               *cfg.Env,
		}
		if dev.Limits, err = d.limits(r); err != nil {
			return c, err
		}
		if cfg.PKey != nil {
			if dev.PKey, err = pkeyOf(h, *cfg.PKey, facts.pkeys); err != nil {
				return c, err
			}
		}
		if len(c.Devices) > 0 && !samePKey(c.Devices[0].PKey, dev.PKey) {
			return c, fmt.Errorf("requests %s and %s need different P_Key settings (%s, %s), but a container gets one NCCL_IB_PKEY", c.Devices[0].Request, r.Request, pkeyName(c.Devices[0].PKey), pkeyName(dev.PKey))
		}
		if f := *cfg.AddressFamily; f != configapi.AddressFamilyAuto {
			dev.AddressFamily = string(f)
		}
		if len(c.Devices) > 0 && c.Devices[0].AddressFamily != dev.AddressFamily {
			return c, fmt.Errorf("requests %s and %s ask for different addressFamily (%s, %s), but a container gets one set of NCCL/UCX GID hints", c.Devices[0].Request, r.Request, familyName(c.Devices[0].AddressFamily), familyName(dev.AddressFamily))
		}
		if r.ShareID != nil {
			dev.ShareID = string(*r.ShareID)
		}
		dev.MoveNetdev = *cfg.MoveNetdev
		if err := d.checkMoveLocked(c, dev); err != nil {
			return c, err
		}
		if dev.MoveNetdev && d.movesLocked(c, dev) {
			err, checked := facts.netdevs[h.Name]
			if !checked {
				err = fmt.Errorf("HCA %s: %w", h.Name, errNoUplinkFacts)
			}
			if err != nil {
				return c, fmt.Errorf("device %s: %w", r.Device, err)
			}
		}
		if d.movesLocked(c, dev) {
			dev.MovedHCA = checkpoint.SnapshotHCA(h)
		}
		if holder := holderOf(dev, c.UID, cp, pending); holder != "" {
			return c, fmt.Errorf("device %s (%s) is already prepared for claim %s; refusing to hand one HCA to two claims", r.Device, h.Name, holder)
		}
		dev.CDIDeviceIDs = []string{cdi.QualifiedName(cdi.DeviceName(c.UID, r.Device, dev.ShareID))}
		c.Devices = append(c.Devices, dev)
	}
	return c, nil
}

// lookupLocked finds the HCA of an allocation result in the inventory.
func (d *Driver) lookupLocked(r resourceapi.DeviceRequestAllocationResult) (hca.HCA, error) {
	if r.Pool != d.cfg.NodeName {
		return hca.HCA{}, fmt.Errorf("device %s is from pool %q, but this node's pool is %q", r.Device, r.Pool, d.cfg.NodeName)
	}
	if h, ok := d.byDevice[r.Device]; ok {
		return h, nil
	}
	if d.isLegacy(r.Device) {
		if len(d.byDevice) == 0 {
			return hca.HCA{}, fmt.Errorf("device %s stands for the node's HCAs, but none is usable on node %s", r.Device, d.cfg.NodeName)
		}
		return hca.HCA{}, nil
	}
	for _, h := range d.inv.HCAs {
		if deviceName(h) == r.Device {
			return h, fmt.Errorf("device %s (%s) is not usable any more: %s", r.Device, h.Name, h.UnusableReason)
		}
	}
	return hca.HCA{}, fmt.Errorf("device %s is no longer on node %s (HCA removed, or its driver unloaded?)", r.Device, d.cfg.NodeName)
}

// holderOf names another claim that holds dev, or "". Two admin-access
// claims may share a device; nothing else may (sharing modes come with
// share IDs, which the allocator hands out per claim).
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

func (d *Driver) isLegacy(device string) bool {
	return d.cfg.LegacyShares > 0 && device == devices.LegacyDeviceName
}

// usableLocked returns the usable HCAs sorted by name.
func (d *Driver) usableLocked() []hca.HCA {
	var out []hca.HCA
	for _, h := range d.inv.HCAs {
		if _, ok := d.byDevice[deviceName(h)]; ok {
			out = append(out, h)
		}
	}
	return out
}

// claimFacts is what resolving a claim needs from outside the driver's
// state: its pods' network (informer lookups that may fall back to an API
// call) and the P_Key tables its configs name (up to 128 sysfs reads a
// port). gatherFacts collects them before d.mu is taken, so neither holds
// up a rescan or another call.
type claimFacts struct {
	network    cdi.Network
	networkErr error
	// exclusive is the netns mode the lookup assumed: it decides whether
	// a failed lookup is fatal.
	exclusive bool
	pkeys     pkeyTables
	// netdevs is the moveNetdev check of each HCA whose netdevs would
	// move, by ibdev: nil when they may.
	netdevs map[string]error
}

// pkeyTables are P_Key tables read ahead, by ibdev and port.
type pkeyTables map[portRef]pkeyTable

type portRef struct {
	ibdev string
	port  int
}

type pkeyTable struct {
	entries []hca.PKey
	err     error
}
