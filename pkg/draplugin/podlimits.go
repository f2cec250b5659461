package draplugin

// Hot path: the rdma.max of a pod's cgroup. The kernel charges a verbs
// object to the cgroup of the process that creates it, so a container's
// limit alone does not bound a sidecar handed its uverbs file: the hook
// also limits the pod (the cgroup above its containers) to the sum of what
// the pod's claims consumed. A claim reserved for several pods was counted
// once by the scheduler, so each of those pods gets an even share of it.

import (
	"fmt"
	"slices"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
)

// share is what each pod of claim c may use of limits l: l divided evenly
// among the pods c is reserved for (0, unlimited, stays 0).
func share(c checkpoint.Claim, l checkpoint.Limits) checkpoint.Limits {
	n := int64(max(len(c.PodUIDs), 1))
	return checkpoint.Limits{HCAHandles: l.HCAHandles / n, HCAObjects: l.HCAObjects / n}
}

// checkShares refuses a claim whose limits leave a pod nothing: a share of
// 0 would read as unlimited.
func checkShares(c checkpoint.Claim) error {
	n := int64(len(c.PodUIDs))
	for _, dev := range c.Devices {
		l := dev.Limits
		if n < 2 || l == nil {
			continue
		}
		for name, v := range map[string]int64{"hcaHandles": l.HCAHandles, "hcaObjects": l.HCAObjects} {
			if v > 0 && v < n {
				return fmt.Errorf("device %s: the claim consumed %s %d, which its %d pods cannot share (each pod gets an even part of a shared claim's limits): ask for at least %d",
					dev.Device, name, v, n, n)
			}
		}
	}
	return nil
}

// podTotals are, per ibdev, the limits of each pod claim c is reserved
// for: the sum of the shares of every claim of candidates reserved for
// that pod (c included, each claim once), unlimited where one of them is.
type podTotals map[string][]cdi.PodLimit

func podLimitsOf(cfg *Config, v *view, c checkpoint.Claim, candidates []checkpoint.Claim) podTotals {
	out := podTotals{}
	for _, pod := range c.PodUIDs {
		type total struct {
			handles, objects int64
			unlimitedHandles bool
			unlimitedObjects bool
		}
		sums := map[string]*total{}
		add := func(o checkpoint.Claim) {
			if !slices.Contains(o.PodUIDs, pod) {
				return
			}
			for _, dev := range o.Devices {
				names := []string{dev.IBDev}
				if dev.IBDev == "" && cfg.isLegacy(dev.Device) {
					names = v.usableNames()
				}
				for _, name := range names {
					t := sums[name]
					if t == nil {
						t = &total{}
						sums[name] = t
					}
					if dev.Limits == nil {
						t.unlimitedHandles, t.unlimitedObjects = true, true
						continue
					}
					s := share(o, *dev.Limits)
					t.handles += s.HCAHandles
					t.objects += s.HCAObjects
					t.unlimitedHandles = t.unlimitedHandles || s.HCAHandles == 0
					t.unlimitedObjects = t.unlimitedObjects || s.HCAObjects == 0
				}
			}
		}
		seen := map[string]bool{c.UID: true}
		add(c)
		for _, o := range candidates {
			if !seen[o.UID] { // a claim prepared again is in candidates twice
				seen[o.UID] = true
				add(o)
			}
		}
		for name, t := range sums {
			p := cdi.PodLimit{UID: pod, Handles: t.handles, Objects: t.objects}
			if t.unlimitedHandles {
				p.Handles = 0
			}
			if t.unlimitedObjects {
				p.Objects = 0
			}
			out[name] = append(out[name], p)
		}
	}
	return out
}
