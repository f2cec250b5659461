package draplugin

// The kubelet's calls: each is admitted by the drain gate, handed to the
// claim state and counted. Nothing here holds a lock.

import (
	"context"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
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
	done, err := d.calls.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	v := d.pub.current()
	facts := d.facts.gather(ctx, v, claims)
	results, prepared, err := d.claims.prepare(ctx, v, claims, facts)
	if err != nil {
		return nil, err
	}
	for _, c := range prepared {
		d.status.prepared(d.cfg, v, c)
	}
	d.metrics.observe(d.metrics.prepareTotal, d.metrics.prepareDuration, results, start)
	return results, nil
}

// UnprepareResourceClaims removes the claims' CDI specs and forgets them.
// It works from the checkpoint alone: the claims may already be deleted.
// An unknown claim is success (the kubelet retries after restarts).
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	start := time.Now()
	done, err := d.calls.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	results, moved, err := d.claims.unprepare(ctx, claims)
	if err != nil {
		return nil, err
	}
	d.status.unprepared(claims, results)
	d.metrics.observeErrs(d.metrics.unprepareTotal, d.metrics.unprepareDuration, results, start)
	d.returns.checkAsync(ctx, moved)
	return results, nil
}

// HandleError is called by the helper for background errors, mostly from
// publishing: see publisher.handleError.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.pub.handleError(ctx, err, msg)
}

// WatchHealthStatus sends the health of every device at once, again on
// every change, and at least every 10 s so the kubelet's 30 s lease never
// lapses, until ctx ends.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return d.pub.watchHealth(ctx, reports)
}
