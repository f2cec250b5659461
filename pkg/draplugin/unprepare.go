package draplugin

// The hot path's other half: a pod has ended and the kubelet frees its claims.

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
)

// UnprepareResourceClaims removes the claims' CDI specs and forgets them.
// It works from the checkpoint alone: the claims may already be deleted.
// An unknown claim is success (the kubelet retries after restarts).
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	start := time.Now()
	d.mu.Lock()
	if err := d.refuseWhileDraining(ctx); err != nil {
		return nil, err
	}
	locked := true
	defer func() {
		if locked {
			d.mu.Unlock()
		}
	}()

	results := make(map[types.UID]error, len(claims))
	var done []string
	moved := map[string]string{} // ibdev -> claim, of HCAs the kernel should hand back
	var cp checkpoint.Checkpoint
	if d.meta.dataDir != "" {
		var err error
		if cp, err = d.store.Load(); err != nil {
			return nil, fmt.Errorf("reading the checkpoint: %w", err)
		}
	}
	for _, claim := range claims {
		if err := d.specs.RemoveClaim(string(claim.UID)); err != nil {
			results[claim.UID] = fmt.Errorf("claim %s: removing its CDI spec: %w", claim.String(), err)
			continue
		}
		if d.meta.dataDir != "" {
			// Also when metadata is off now: an earlier daemon may have
			// written them.
			if err := d.meta.remove(claim.Namespace, claim.Name, string(claim.UID), sameNameClaim(cp, claim.Namespace, claim.Name, string(claim.UID))); err != nil {
				results[claim.UID] = fmt.Errorf("claim %s: %w", claim.String(), err)
				continue
			}
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
	d.statusUnprepared(claims, results)
	klog.FromContext(ctx).V(4).Info("Unprepared claims", "count", len(done))
	d.metrics.observeErrs(d.metrics.unprepareTotal, d.metrics.unprepareDuration, results, start)
	d.mu.Unlock()
	locked = false
	d.checkReturnedAsync(ctx, moved)
	return results, nil
}
