package draplugin

import (
	"context"
	"fmt"

	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
)

// After a reboot the checkpoint (on disk) still lists the claims prepared
// before it, while the CDI specs (tmpfs), the pods' network namespaces and
// their RDMA cgroups are gone. The kubelet asks again for exactly those
// claims: its DRA manager restores its own state file with every claim
// marked not prepared, and calls NodePrepareResources for each pod still
// bound to the node when it creates the pod's new sandbox (no container
// runs before that), and NodeUnprepareResources, from its reconcile loop,
// for the claims whose pods are gone (k8s.io/kubernetes v1.37.2,
// pkg/kubelet/cm/dra: newClaimInfoFromState, prepareResources,
// reconcileLoop). So the daemon discards the previous boot's claims rather
// than rewriting their specs: the new prepare starts from the current
// inventory (an ibdev may be renamed, a GID index moved, a moved HCA be
// back in the host's namespace), and an unprepare of a discarded claim is
// the no-op success of an unknown claim.
//
// A claim without a boot ID (a version 0 checkpoint) cannot be placed and
// is kept, its spec rewritten as after any restart.

// registerRebootMetrics adds the reboot counter to NewMetrics' set.
func (m *Metrics) registerRebootMetrics() {
	m.rebootDiscarded = metrics.NewCounter(&metrics.CounterOpts{Namespace: namespace, Name: "reboot_discarded_claims_total",
		Help: "Claims of the checkpoint prepared before the node's last reboot, discarded at start-up (the kubelet prepares again those still in use).", StabilityLevel: metrics.ALPHA})
	m.Registry.MustRegister(m.rebootDiscarded)
}

// discardPreviousBoot removes the claims prepared in an earlier boot from
// the checkpoint, and their specs where the CDI dir survived, saying so in
// one log line.
func (s *claimState) discardPreviousBoot(ctx context.Context) error {
	if s.bootID == "" {
		return nil
	}
	var discarded []checkpoint.Claim
	err := s.store.Update(func(cp *checkpoint.Checkpoint) error {
		discarded = discarded[:0]
		for _, uid := range sortedKeys(cp.Claims) {
			if c := cp.Claims[uid]; c.BootID != "" && c.BootID != s.bootID {
				discarded = append(discarded, c)
				delete(cp.Claims, uid)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("discarding the claims prepared before the node rebooted: %w", err)
	}
	if len(discarded) == 0 {
		return nil
	}
	names := make([]string, 0, len(discarded))
	previous := map[string]bool{}
	for _, c := range discarded {
		names = append(names, c.Namespace+"/"+c.Name)
		previous[c.BootID] = true
		// Only where the CDI dir is not a tmpfs: the spec of a claim that
		// is no longer prepared must not outlive it.
		if err := s.specs.RemoveClaim(c.UID); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot remove the CDI spec of a claim discarded after a reboot", "claim", c.Namespace+"/"+c.Name, "claimUID", c.UID)
			s.metrics.backgroundErrors.WithLabelValues("cdi").Inc()
		}
	}
	klog.FromContext(ctx).Info("The node rebooted since these claims were prepared: discarded them from the checkpoint; the kubelet prepares again the claims of pods still on this node, and unprepares the others as no-ops",
		"discarded", len(discarded), "claims", names, "previousBootIDs", sortedKeys(previous), "bootID", s.bootID)
	s.metrics.rebootDiscarded.Add(float64(len(discarded)))
	return nil
}
