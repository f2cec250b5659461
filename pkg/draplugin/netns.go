package draplugin

// Exclusive RDMA netns mode: an RDMA device belongs to one network
// namespace. A pod on the host network shares the initial one and needs
// nothing; for any other pod, the claim's CDI spec carries a createRuntime
// hook (rdma-dra-hook netns) that moves the HCA into the container's
// namespace. The kernel hands it back when that namespace goes away.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// netnsReturnWait bounds unprepare's wait for moved HCAs to come back: the
// kernel dismantles a network namespace asynchronously after its last user.
const netnsReturnWait = 2 * time.Second

// sharingConflict says why shared HCAs cannot serve pods off the host
// network in inv's netns mode, or "" when they can.
func sharingConflict(cfg *Config, inv hca.Inventory) string {
	if cfg.Shares == 0 || !cfg.AllowNonHostNetwork || inv.NetnsMode != hca.NetnsExclusive {
		return ""
	}
	return fmt.Sprintf("this node's RDMA subsystem is in exclusive netns mode (read from %s): an HCA lives in one network namespace "+
		"at a time and is moved into each pod that is not on the host network, so HCAs cannot be shared (--sharing=shared); "+
		"run the driver with --sharing=exclusive, or with --allow-non-host-network=false (hostNetwork pods share the initial namespace), "+
		"or set the node back to shared mode (rdma system set netns shared)", netnsSourceName(inv.NetnsModeSource))
}

func netnsSourceName(s hca.Source) string {
	switch s {
	case hca.SourceNetlink:
		return "RDMA netlink"
	case hca.SourceSysfs:
		return "/sys/module/ib_core/parameters/netns_mode"
	}
	return string(s)
}

// moves reports whether dev of claim c moves into its pod's network
// namespace under the current netns mode.
func moves(v *view, c checkpoint.Claim, dev checkpoint.Device) bool {
	return v.exclusive() && c.Network == string(cdi.NetworkPod) && dev.IBDev != "" && dev.ShareID == ""
}

// checkMove refuses, at prepare, a device that would have to move
// but cannot.
func checkMove(cfg *Config, v *view, c checkpoint.Claim, dev checkpoint.Device) error {
	if !v.exclusive() || c.Network != string(cdi.NetworkPod) {
		return nil
	}
	name := dev.IBDev
	if name == "" {
		name = "every HCA of the node"
	}
	switch {
	case dev.IBDev == "" || dev.ShareID != "":
		return fmt.Errorf("device %s (%s) is shared, but this node's RDMA subsystem is now in exclusive netns mode, "+
			"where a pod that is not on the host network sees only HCAs moved into its namespace, one pod at a time; "+
			"set the node back (rdma system set netns shared) or restart the driver with --sharing=exclusive", dev.Device, name)
	case cfg.HookPath == "":
		return fmt.Errorf("device %s (%s) must move into the pod's network namespace (exclusive RDMA netns mode, pod not on the host network), "+
			"but the driver has no hook to move it: set --hook-path to the host path of rdma-dra-hook", dev.Device, name)
	}
	return nil
}

// netnsHook is the hook moving dev into the container's namespace,
// or nil when it stays where it is.
func (s *claimState) netnsHook(v *view, c checkpoint.Claim, dev checkpoint.Device, h hca.HCA) (*cdispec.Hook, error) {
	if !moves(v, c, dev) {
		return nil, nil
	}
	if s.cfg.HookPath == "" {
		return nil, fmt.Errorf("device %s (%s) must move into the pod's network namespace, but the driver has no --hook-path", dev.Device, h.Name)
	}
	// The hook finds the netdevs itself when it runs, by identity: names
	// written now could name another interface by then.
	var nodeIPs []string
	if dev.MoveNetdev {
		nodeIPs = s.ips.args()
	}
	return cdi.NetnsHook(s.cfg.HookPath, h.Name, dev.MoveNetdev, nodeIPs), nil
}

// netnsModeChanged reacts to the mode changing under a running
// daemon: specs are rewritten so restarted containers get (or lose) the
// move, and a conflict with shared HCAs is said loudly.
func (s *claimState) netnsModeChanged(ctx context.Context, old, cur *view) {
	logger := klog.FromContext(ctx)
	logger.Info("RDMA netns mode changed", "from", old.inv.NetnsMode, "to", cur.inv.NetnsMode, "source", cur.inv.NetnsModeSource)
	if why := sharingConflict(s.cfg, cur.inv); why != "" {
		logger.Error(nil, "Pods that are not on the host network can no longer be prepared: "+why)
		s.metrics.backgroundErrors.WithLabelValues("netns").Inc()
	}
	s.rewriteSpecs(ctx, cur, func(c checkpoint.Claim) bool { return c.Network == string(cdi.NetworkPod) })
}

// keepMoved carries over the HCAs that a prepared claim moved into a
// pod's namespace: the host's class/infiniband no longer lists them (it is
// per namespace in exclusive mode) while class/infiniband_verbs still does
// (inv.Hidden). They are in use, not gone. Each comes from the last
// inventory or, in a daemon started while it was away, from the snapshot
// the checkpoint took at prepare.
func (p *publisher) keepMoved(ctx context.Context, old hca.Inventory, inv *hca.Inventory) {
	if inv.NetnsMode != hca.NetnsExclusive {
		return
	}
	cp, err := p.store.Load()
	if err != nil {
		return
	}
	type holder struct {
		claim    string
		snapshot *checkpoint.HCA
	}
	moved := map[string]holder{} // ibdev -> its claim
	for _, uid := range sortedKeys(cp.Claims) {
		c := cp.Claims[uid]
		for _, dev := range c.Devices {
			if c.Network == string(cdi.NetworkPod) && dev.IBDev != "" && dev.ShareID == "" {
				moved[dev.IBDev] = holder{c.Namespace + "/" + c.Name, dev.MovedHCA}
			}
		}
	}
	for _, name := range sortedKeys(moved) {
		// Hidden: the verbs class still names it, so it is not unplugged.
		if !slices.Contains(inv.Hidden, name) || slices.ContainsFunc(inv.HCAs, func(n hca.HCA) bool { return n.Name == name }) {
			continue
		}
		i := slices.IndexFunc(old.HCAs, func(h hca.HCA) bool { return h.Name == name })
		var h hca.HCA
		switch {
		case i >= 0:
			h = old.HCAs[i]
		case moved[name].snapshot != nil:
			if h = moved[name].snapshot.HCA(); h.Name != name {
				klog.FromContext(ctx).Error(nil, "The checkpoint's record of a moved HCA names another HCA; it is not published until it returns", "hca", name, "recorded", h.Name, "claim", moved[name].claim)
				p.metrics.backgroundErrors.WithLabelValues("checkpoint").Inc()
				continue
			}
		default:
			continue // prepared by a daemon that kept no record
		}
		note := fmt.Sprintf("moved into the network namespace of the pod of claim %s: the host's sysfs does not list it until it returns", moved[name].claim)
		if !slices.Contains(h.Warnings, note) {
			h.Warnings = append(slices.Clone(h.Warnings), note)
		}
		inv.HCAs = append(inv.HCAs, h)
	}
	slices.SortFunc(inv.HCAs, func(a, b hca.HCA) int { return strings.Compare(a.Name, b.Name) })
}

// movedDevices lists the HCAs of claim c that were moved (by name).
func movedDevices(v *view, c checkpoint.Claim) []string {
	var out []string
	for _, dev := range c.Devices {
		if moves(v, c, dev) {
			out = append(out, dev.IBDev)
		}
	}
	return out
}

// returnChecks are the background checks that moved HCAs came back.
type returnChecks struct {
	hostRDMA HostRDMA // nil: no checks
	metrics  *Metrics
	running  sync.WaitGroup
}

// checkAsync runs check in the background: a wait inside unprepare would
// hold up the kubelet's call.
func (r *returnChecks) checkAsync(ctx context.Context, moved map[string]string) {
	if len(moved) == 0 || r.hostRDMA == nil {
		return
	}
	ctx = context.WithoutCancel(ctx) // the call's context ends with the call
	r.running.Go(func() { r.check(ctx, moved) })
}

// check waits up to netnsReturnWait for the moved HCAs of
// unprepared claims (ibdev -> claim) to be back in the host's namespace.
// One that is not is a warning, never a failed unprepare: the kubelet must
// be able to finish, and the kernel returns the device whenever the last
// process in that namespace ends.
func (r *returnChecks) check(ctx context.Context, moved map[string]string) {
	if len(moved) == 0 || r.hostRDMA == nil {
		return
	}
	logger := klog.FromContext(ctx)
	deadline := time.Now().Add(netnsReturnWait)
	for {
		devs, err := r.hostRDMA.Devices()
		if err != nil {
			logger.Error(err, "Cannot check that moved HCAs are back in the host's network namespace", "hcas", sortedKeys(moved))
			r.metrics.backgroundErrors.WithLabelValues("netns").Inc()
			return
		}
		missing := map[string]string{}
		for name, claim := range moved {
			if !slices.ContainsFunc(devs, func(dev rdmanl.Device) bool { return dev.Name == name }) {
				missing[name] = claim
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, name := range sortedKeys(missing) {
				logger.Info("Warning: HCA has not returned to the host's network namespace after its claim was unprepared; "+
					"it cannot be prepared again until the namespace holding it goes away (a process still in the pod's network namespace?)",
					"hca", name, "claim", missing[name], "waited", netnsReturnWait)
				r.metrics.netnsNotReturned.WithLabelValues(name).Inc()
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}
