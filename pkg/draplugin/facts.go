package draplugin

// What resolving a claim needs from outside the driver's state, gathered
// before the claim state takes any lock: the claim's configs, its pods
// (informer lookups that may fall back to an API call), the P_Key tables
// its configs name (up to 128 sysfs reads a port) and the moveNetdev check
// (a GET of the Node and netlink route reads).

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
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// factReader gathers claims' facts.
type factReader struct {
	cfg       *Config
	pods      PodGetter
	pkeys     PKeyReader
	hostLinks HostLinks
	nodeIPs   NodeIPs
	ips       *nodeIPCache // the InternalIPs as last read, for the hook
}

// claimFacts is what resolving one claim needs from outside the driver.
type claimFacts struct {
	configs    map[string]requestConfig // by request
	network    cdi.Network
	networkErr error
	pkeys      pkeyTables
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

// gather looks up each claim's pods and reads the P_Key tables its configs
// ask for, as v has the HCAs.
func (f *factReader) gather(ctx context.Context, v *view, claims []*resourceapi.ResourceClaim) []claimFacts {
	exclusive := v.exclusive()
	out := make([]claimFacts, len(claims))
	for i, claim := range claims {
		fc := &out[i]
		fc.configs = requestConfigs(f.cfg, claim)
		fc.network, fc.networkErr = f.claimNetwork(ctx, claim, exclusive)
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			rc := fc.configs[r.Request]
			h, ok := v.byDevice[r.Device]
			if r.Driver != f.cfg.DriverName || rc.err != nil || !ok {
				continue // resolve says why
			}
			if rc.cfg.PKey != nil {
				fc.readPKeys(f.pkeys, h)
			}
			if exclusive && fc.network == cdi.NetworkPod && fc.networkErr == nil && r.ShareID == nil && *rc.cfg.MoveNetdev {
				if _, done := fc.netdevs[h.Name]; !done {
					if fc.netdevs == nil {
						fc.netdevs = map[string]error{}
					}
					fc.netdevs[h.Name] = f.netdevUse(ctx, h)
				}
			}
		}
	}
	return out
}

// readPKeys reads the P_Key table of every port of h, once.
func (fc *claimFacts) readPKeys(reader PKeyReader, h hca.HCA) {
	for _, p := range h.Ports {
		ref := portRef{h.Name, p.Number}
		if _, done := fc.pkeys[ref]; done {
			continue
		}
		if fc.pkeys == nil {
			fc.pkeys = pkeyTables{}
		}
		entries, err := reader.PKeys(h.Name, p.Number)
		fc.pkeys[ref] = pkeyTable{entries, err}
	}
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
			return nil, fmt.Errorf("pkey %s: HCA %s port %d: no P_Key table read", key, h.Name, p.Number)
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
func (f *factReader) claimNetwork(ctx context.Context, claim *resourceapi.ResourceClaim, exclusive bool) (cdi.Network, error) {
	enforce := !f.cfg.AllowNonHostNetwork
	if f.pods == nil {
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
		pod, err := f.pods.GetPod(ctx, claim.Namespace, ref.Name, ref.UID)
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
