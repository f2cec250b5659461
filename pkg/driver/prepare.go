package driver

// The hot path: everything here runs while a pod waits to start.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	gosort "slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/rdma-dra/rdma-dra-driver/api/rdma.dra.dev/v1alpha1"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	rslices "github.com/rdma-dra/rdma-dra-driver/pkg/slices"
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
	d.mu.Lock()
	defer d.mu.Unlock()

	cp, err := d.store.Load()
	if err != nil {
		return nil, fmt.Errorf("reading the checkpoint: %w", err)
	}
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var resolved []checkpoint.Claim
	for _, claim := range claims {
		c, err := d.resolveLocked(ctx, claim, cp, resolved)
		if err != nil {
			results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)}
			continue
		}
		resolved = append(resolved, c)
	}

	candidates := append(gosort.Collect(maps.Values(cp.Claims)), resolved...)
	var written []checkpoint.Claim
	for _, c := range resolved {
		if err := d.writeSpecLocked(c, d.groupLocked(c, candidates)); err != nil {
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
			// Without a record, unprepare could not clean up: undo the spec
			// unless an earlier, recorded prepare owns it.
			if _, known := cp.Claims[c.UID]; !known {
				_ = d.specs.RemoveClaim(c.UID)
			}
			results[types.UID(c.UID)] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: recording it in the checkpoint: %w", c.Namespace, c.Name, err)}
			continue
		}
		results[types.UID(c.UID)] = kubeletplugin.PrepareResult{Devices: d.resultDevicesLocked(c)}
	}
	d.metrics.observe(d.metrics.prepareTotal, d.metrics.prepareDuration, results, start)
	return results, nil
}

// resolveLocked turns a claim's allocation into the record of what to
// prepare, checking the policy, the config and the inventory.
func (d *Driver) resolveLocked(ctx context.Context, claim *resourceapi.ResourceClaim, cp checkpoint.Checkpoint, pending []checkpoint.Claim) (checkpoint.Claim, error) {
	c := checkpoint.Claim{
		UID:        string(claim.UID),
		Namespace:  claim.Namespace,
		Name:       claim.Name,
		BootID:     d.bootID,
		PreparedAt: time.Now().UTC(),
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
	gosort.Sort(c.PodUIDs)
	network, err := d.claimNetwork(ctx, claim)
	if err != nil {
		return c, err
	}
	c.Network = string(network)

	for _, r := range alloc.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		cfg, err := configFor(d.cfg.DriverName, alloc.Devices.Config, r.Request)
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
			if dev.PKey, err = d.pkey(h, *cfg.PKey); err != nil {
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
		if d.movesLocked(c, dev) {
			if dev.MovedHCA, err = json.Marshal(h); err != nil {
				return c, fmt.Errorf("device %s (%s): recording it before it moves: %w", r.Device, h.Name, err)
			}
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
	return d.cfg.LegacyShares > 0 && device == rslices.LegacyDeviceName
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

// limits reads the RDMA cgroup capacities an allocation consumed.
func (d *Driver) limits(r resourceapi.DeviceRequestAllocationResult) (*checkpoint.Limits, error) {
	var l checkpoint.Limits
	for name, dst := range map[string]*int64{rslices.CapacityHCAHandles: &l.HCAHandles, rslices.CapacityHCAObjects: &l.HCAObjects} {
		q, ok := r.ConsumedCapacity[resourceapi.QualifiedName(d.cfg.DriverName+"/"+name)]
		if !ok {
			continue
		}
		v, exact := q.AsInt64()
		if !exact || v < 0 {
			return nil, fmt.Errorf("device %s: consumed capacity %s is %s, want a whole number >= 0", r.Device, name, q.String())
		}
		*dst = v
	}
	if l == (checkpoint.Limits{}) {
		return nil, nil
	}
	if d.cfg.HookPath == "" {
		return nil, fmt.Errorf("device %s: the claim consumed RDMA cgroup limits (%d handles, %d objects), but this node sets none (no rdma cgroup controller, or no hook)", r.Device, l.HCAHandles, l.HCAObjects)
	}
	return &l, nil
}

// pkey finds the claim's partition in every port of h: NCCL takes one
// index, so the ports must agree on it.
func (d *Driver) pkey(h hca.HCA, key string) (*checkpoint.PKey, error) {
	want, err := configapi.ParsePKey(key)
	if err != nil {
		return nil, err
	}
	if h.Name == "" {
		return nil, fmt.Errorf("pkey %s: the legacy device stands for every HCA; ask for HCAs by class to use a partition", key)
	}
	reader, ok := d.source.(PKeyReader)
	if !ok {
		return nil, fmt.Errorf("pkey %s: this node's inventory cannot read P_Key tables", key)
	}
	var out *checkpoint.PKey
	for _, p := range h.Ports {
		table, err := reader.PKeys(h.Name, p.Number)
		if err != nil {
			return nil, fmt.Errorf("pkey %s: %w", key, err)
		}
		i, ok := hca.FindPKey(table, want)
		if !ok {
			return nil, fmt.Errorf("HCA %s port %d has no P_Key 0x%04x in its table (%s); the subnet manager must add the port to the partition", h.Name, p.Number, want, describePKeys(table))
		}
		if out != nil && out.Index != i {
			return nil, fmt.Errorf("P_Key 0x%04x is at index %d on HCA %s port %d but at %d on an earlier port; NCCL_IB_PKEY takes one index", want, i, h.Name, p.Number, out.Index)
		}
		out = &checkpoint.PKey{Value: want, Index: i}
	}
	if out == nil {
		return nil, fmt.Errorf("pkey %s: HCA %s has no ports", key, h.Name)
	}
	return out, nil
}

func describePKeys(table []hca.PKey) string {
	if len(table) == 0 {
		return "empty"
	}
	var b strings.Builder
	for i, k := range table {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "0x%04x at %d", k.Value, k.Index)
	}
	return b.String()
}

func samePKey(a, b *checkpoint.PKey) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func pkeyName(k *checkpoint.PKey) string {
	if k == nil {
		return "none"
	}
	return fmt.Sprintf("0x%04x at index %d", k.Value, k.Index)
}

func familyName(f string) string {
	if f == "" {
		return string(configapi.AddressFamilyAuto)
	}
	return f
}

// claimNetwork looks up the pods the claim is reserved for: it enforces
// --allow-non-host-network=false, and tells the GID hints whether the
// host's GID table is the pods' own. Where the policy allows every pod, a
// failed lookup only costs the hints their host index (NetworkUnknown).
//
// In exclusive RDMA netns mode the answer decides whether the HCAs move, so
// it must be known: a failed lookup is an error there too, and so is a
// claim reserved for pods both on and off the host network.
func (d *Driver) claimNetwork(ctx context.Context, claim *resourceapi.ResourceClaim) (cdi.Network, error) {
	enforce := !d.cfg.AllowNonHostNetwork
	exclusive := d.exclusiveLocked()
	if d.pods == nil {
		if exclusive {
			return "", errors.New("this node's RDMA subsystem is in exclusive netns mode, where the HCAs of a pod that is not on the host network move into its namespace, but the driver cannot look pods up")
		}
		return cdi.NetworkUnknown, nil // New refuses this when enforcing
	}
	host, own := 0, 0
	for _, ref := range claim.Status.ReservedFor {
		if ref.APIGroup != "" || ref.Resource != "pods" {
			continue
		}
		pod, err := d.pods.GetPod(ctx, claim.Namespace, ref.Name, ref.UID)
		if err == nil && pod.UID != ref.UID {
			err = fmt.Errorf("pod %s/%s has UID %s, but the claim is reserved for UID %s", claim.Namespace, ref.Name, pod.UID, ref.UID)
		} else if err != nil {
			err = fmt.Errorf("looking up pod %s/%s for the hostNetwork policy: %w", claim.Namespace, ref.Name, err)
		}
		if err != nil {
			if enforce || exclusive {
				return "", err
			}
			klog.FromContext(ctx).V(2).Info("No GID index hints for the claim", "claim", klog.KObj(claim), "err", err)
			return cdi.NetworkUnknown, nil
		}
		if pod.Spec.HostNetwork {
			host++
			continue
		}
		if enforce {
			return "", fmt.Errorf("pod %s/%s does not use hostNetwork, and RDMA for non-hostNetwork pods is disabled on this node; %s", claim.Namespace, ref.Name, HostNetworkHint)
		}
		own++
	}
	switch {
	case exclusive && host > 0 && own > 0:
		return "", fmt.Errorf("the claim is reserved for pods on the host network and pods on their own, but this node's RDMA subsystem is in exclusive netns mode, where an HCA is in one network namespace at a time")
	case host > 0 && own == 0:
		return cdi.NetworkHost, nil
	case own > 0 && host == 0:
		return cdi.NetworkPod, nil
	}
	return cdi.NetworkUnknown, nil
}

// writeSpecLocked (re)writes the CDI spec of a resolved claim. group is the
// set of HCAs the claim's containers see with it, for the aggregate env.
func (d *Driver) writeSpecLocked(c checkpoint.Claim, group []hca.HCA) error {
	env := false
	family := ""
	var pkey *cdi.PKey
	var devices []cdi.ClaimDevice
	for _, dev := range c.Devices {
		opts := cdi.EditOptions{ManagementDevices: dev.ManagementDevices, Env: dev.Env, HostDevRoot: d.cfg.HostDevRoot}
		var edits cdispec.ContainerEdits
		var err error
		if h, ok := d.byDevice[dev.Device]; ok {
			edits, err = cdi.DeviceEdits(h, opts)
			// The move first: a container whose HCA cannot join its
			// namespace is refused before anything else is done for it.
			var move *cdispec.Hook
			if err == nil {
				if move, err = d.netnsHookLocked(c, dev, h); move != nil {
					edits.Hooks = append(edits.Hooks, move)
				}
			}
			if err == nil && dev.Limits != nil {
				edits.Hooks = append(edits.Hooks, cdi.LimitHook(d.cfg.HookPath, h.Name, dev.Limits.HCAHandles, dev.Limits.HCAObjects))
			}
		} else if dev.IBDev == "" && d.isLegacy(dev.Device) {
			if usable := d.usableLocked(); len(usable) > 0 {
				edits, err = cdi.NodeEdits(usable, opts)
			} else {
				// Every HCA gone: the spec must still load (CDI refuses a
				// device without edits) and must not name removed nodes.
				edits = cdispec.ContainerEdits{Env: []string{"RDMA_DEVICES="}}
			}
		} else {
			return fmt.Errorf("device %s (%s) is no longer usable on node %s", dev.Device, dev.IBDev, d.cfg.NodeName)
		}
		if err != nil {
			return err
		}
		env = env || dev.Env
		family = dev.AddressFamily
		if dev.PKey != nil {
			pkey = &cdi.PKey{Value: dev.PKey.Value, Index: dev.PKey.Index}
		}
		devices = append(devices, cdi.ClaimDevice{Name: cdi.DeviceName(c.UID, dev.Device, dev.ShareID), Edits: edits})
	}
	if len(devices) == 0 {
		return d.specs.RemoveClaim(c.UID)
	}
	common := cdi.CommonEdits(d.inv.RDMACM, group, cdi.EditOptions{Env: env, HostDevRoot: d.cfg.HostDevRoot,
		Network: cdi.Network(c.Network), Family: cdi.AddressFamily(family), PKey: pkey})
	return d.specs.WriteClaim(c.UID, common, devices)
}

// groupLocked returns the HCAs a container using claim c may see together:
// its own, plus those of every claim reserved for one of the same pods. All
// claims of a container then carry identical aggregate variables, so the
// runtime's "last device wins" for env cannot hide an HCA.
func (d *Driver) groupLocked(c checkpoint.Claim, candidates []checkpoint.Claim) []hca.HCA {
	seen := map[string]bool{}
	var group []hca.HCA
	add := func(other checkpoint.Claim) {
		for _, dev := range other.Devices {
			hcas := []hca.HCA{d.byDevice[dev.Device]}
			if d.isLegacy(dev.Device) {
				hcas = d.usableLocked()
			}
			for _, h := range hcas {
				if name := deviceName(h); h.Name != "" && !seen[name] {
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
		if gosort.Contains(b.PodUIDs, p) {
			return true
		}
	}
	return false
}

// resultDevicesLocked is what the kubelet hands to the runtime for a
// claim, with each device's metadata when that is on.
func (d *Driver) resultDevicesLocked(c checkpoint.Claim) []kubeletplugin.Device {
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
		if d.cfg.DeviceMetadata {
			kd.Metadata = d.metadataLocked(dev)
		}
		out = append(out, kd)
	}
	return out
}

// metadataLocked is the metadata of a prepared device, from the inventory
// it was prepared with.
func (d *Driver) metadataLocked(dev checkpoint.Device) *kubeletplugin.DeviceMetadata {
	opts := rslices.Options{DriverName: d.cfg.DriverName}
	if h, ok := d.byDevice[dev.Device]; ok {
		attrs := rslices.Metadata(h, d.inv.NetnsMode, dev.ShareID, opts)
		if k := dev.PKey; k != nil {
			v, i := fmt.Sprintf("0x%04x", k.Value), int64(k.Index)
			attrs[d.cfg.DriverName+"/pkey"] = resourceapi.DeviceAttribute{StringValue: &v}
			attrs[d.cfg.DriverName+"/pkeyIndex"] = resourceapi.DeviceAttribute{IntValue: &i}
		}
		if l := dev.Limits; l != nil {
			for name, v := range map[string]int64{"hcaHandleLimit": l.HCAHandles, "hcaObjectLimit": l.HCAObjects} {
				if v > 0 {
					attrs[d.cfg.DriverName+"/"+name] = resourceapi.DeviceAttribute{IntValue: &v}
				}
			}
		}
		return &kubeletplugin.DeviceMetadata{Attributes: attrs}
	}
	if d.isLegacy(dev.Device) {
		return &kubeletplugin.DeviceMetadata{Attributes: rslices.LegacyMetadata(d.usableLocked(), opts)}
	}
	return nil
}

// UnprepareResourceClaims removes the claims' CDI specs and forgets them.
// It works from the checkpoint alone: the claims may already be deleted.
// An unknown claim is success (the kubelet retries after restarts).
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	start := time.Now()
	d.mu.Lock()
	locked := true
	defer func() {
		if locked {
			d.mu.Unlock()
		}
	}()

	results := make(map[types.UID]error, len(claims))
	var done []string
	moved := map[string]string{} // ibdev -> claim, of HCAs the kernel should hand back
	for _, claim := range claims {
		if err := d.specs.RemoveClaim(string(claim.UID)); err != nil {
			results[claim.UID] = fmt.Errorf("claim %s: removing its CDI spec: %w", claim.String(), err)
			continue
		}
		results[claim.UID] = nil
		done = append(done, string(claim.UID))
	}
	err := d.store.Update(func(cp *checkpoint.Checkpoint) error {
		for _, uid := range done {
			if c, ok := cp.Claims[uid]; ok {
				for _, ibdev := range d.movedDevicesLocked(c) {
					moved[ibdev] = c.Namespace + "/" + c.Name
				}
			}
			delete(cp.Claims, uid)
		}
		return nil
	})
	if err != nil {
		moved = nil // still recorded: the kubelet asks again
		for _, uid := range done {
			results[types.UID(uid)] = fmt.Errorf("claim %s: updating the checkpoint: %w", uid, err)
		}
	}
	klog.FromContext(ctx).V(4).Info("Unprepared claims", "count", len(done))
	d.metrics.observeErrs(d.metrics.unprepareTotal, d.metrics.unprepareDuration, results, start)
	// Prepares need not wait for the kernel.
	d.mu.Unlock()
	locked = false
	d.checkReturned(ctx, moved)
	return results, nil
}
