package draplugin

// What a claim needs from outside the driver's lock (pods, P_Key tables) and its limits, gathered before prepare takes the lock so rescans are not held up.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	configapi "github.com/rdma-dra/rdma-dra-driver/api/rdma.dra.dev/v1alpha1"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// limits reads the RDMA cgroup capacities an allocation consumed.
func (d *Driver) limits(r resourceapi.DeviceRequestAllocationResult) (*checkpoint.Limits, error) {
	var l checkpoint.Limits
	for name, dst := range map[string]*int64{devices.CapacityHCAHandles: &l.HCAHandles, devices.CapacityHCAObjects: &l.HCAObjects} {
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
	if err := d.limitPolicy(r, &l); err != nil {
		return nil, err
	}
	if l == (checkpoint.Limits{}) {
		return nil, nil
	}
	if d.cfg.HookPath == "" {
		return nil, fmt.Errorf("device %s: the claim consumed RDMA cgroup limits (%d handles, %d objects), but this node sets none (no rdma cgroup controller, or no hook)", r.Device, l.HCAHandles, l.HCAObjects)
	}
	return &l, nil
}

// gatherFacts looks up each claim's pods and reads the P_Key tables its
// configs ask for, from a snapshot of the inventory; resolveLocked checks
// the snapshot still holds.
func (d *Driver) gatherFacts(ctx context.Context, claims []*resourceapi.ResourceClaim) []claimFacts {
	d.mu.Lock()
	exclusive, byDevice := d.exclusiveLocked(), d.byDevice // byDevice is replaced, never changed
	d.mu.Unlock()
	reader, _ := d.source.(PKeyReader)
	out := make([]claimFacts, len(claims))
	for i, claim := range claims {
		f := &out[i]
		f.exclusive = exclusive
		f.network, f.networkErr = d.claimNetwork(ctx, claim, exclusive)
		if exclusive && f.network == cdi.NetworkPod && f.networkErr == nil {
			f.netdevs = d.checkNetdevs(ctx, claim, byDevice)
		}
		if claim.Status.Allocation == nil || reader == nil {
			continue
		}
		alloc := claim.Status.Allocation
		for _, r := range alloc.Devices.Results {
			if r.Driver != d.cfg.DriverName {
				continue
			}
			cfg, err := configFor(d.cfg.DriverName, alloc.Devices.Config, r.Request)
			h, ok := byDevice[r.Device]
			if err != nil || cfg.PKey == nil || !ok {
				continue // resolveLocked says why
			}
			for _, p := range h.Ports {
				ref := portRef{h.Name, p.Number}
				if _, done := f.pkeys[ref]; done {
					continue
				}
				if f.pkeys == nil {
					f.pkeys = pkeyTables{}
				}
				entries, err := reader.PKeys(h.Name, p.Number)
				f.pkeys[ref] = pkeyTable{entries, err}
			}
		}
	}
	return out
}

// checkNetdevs runs the moveNetdev check (uplink.go) for each HCA of the
// claim whose netdevs would move into its pod; resolveLocked reads it.
func (d *Driver) checkNetdevs(ctx context.Context, claim *resourceapi.ResourceClaim, byDevice map[string]hca.HCA) map[string]error {
	if claim.Status.Allocation == nil {
		return nil
	}
	out := map[string]error{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName || r.ShareID != nil {
			continue
		}
		cfg, err := d.claimConfig(claim, r.Request)
		h, ok := byDevice[r.Device]
		if err != nil || cfg.MoveNetdev == nil || !*cfg.MoveNetdev || !ok {
			continue // resolveLocked says why, or nothing moves
		}
		if _, done := out[h.Name]; !done {
			out[h.Name] = d.netdevUse(ctx, h)
		}
	}
	return out
}

// pkeyOf finds the claim's partition in every port of h, in the tables
// read ahead: NCCL takes one index, so the ports must agree on it.
func pkeyOf(h hca.HCA, key string, tables pkeyTables) (*checkpoint.PKey, error) {
	want, err := configapi.ParsePKey(key)
	if err != nil {
		return nil, err
	}
	if h.Name == "" {
		return nil, fmt.Errorf("pkey %s: the legacy device stands for every HCA; ask for HCAs by class to use a partition", key)
	}
	var out *checkpoint.PKey
	for _, p := range h.Ports {
		t, ok := tables[portRef{h.Name, p.Number}]
		if !ok {
			// Not read ahead: no reader, or the HCA changed since the
			// snapshot; the kubelet retries.
			return nil, fmt.Errorf("pkey %s: HCA %s port %d: no P_Key table read (this node's inventory cannot read P_Key tables, or the HCA changed during the prepare)", key, h.Name, p.Number)
		}
		table, err := t.entries, t.err
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
func (d *Driver) claimNetwork(ctx context.Context, claim *resourceapi.ResourceClaim, exclusive bool) (cdi.Network, error) {
	enforce := !d.cfg.AllowNonHostNetwork
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
