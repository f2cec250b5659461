package draplugin

// The slow path: discovery and publishing. Nothing here runs inside a
// kubelet call.

import (
	"context"
	"errors"
	"slices"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// rescan rediscovers the node and swaps in the new inventory. It reports
// whether anything a claim or a slice depends on changed.
func (d *Driver) rescan(ctx context.Context) (bool, error) {
	d.scanMu.Lock()
	defer d.scanMu.Unlock()
	inv, err := d.source.Discover()
	if err != nil {
		d.metrics.backgroundErrors.WithLabelValues("discovery").Inc()
		return false, err
	}
	d.mu.Lock()
	d.keepMovedLocked(ctx, d.inv, &inv)
	byDevice := devices.Published(inv)
	// The first inventory always counts as a change, even an empty one: the
	// device-plugin shim waits for it.
	changed := !d.scanned || !apiequality.Semantic.DeepEqual(d.inv, inv)
	modeChanged := d.scanned && d.inv.NetnsMode != inv.NetnsMode
	d.scanned = true
	old := d.inv
	d.inv, d.byDevice = inv, byDevice
	if changed {
		d.updateTaintsLocked(time.Now())
		d.notifyHealthLocked()
		d.refreshNodeWideSpecsLocked(ctx)
	}
	if modeChanged {
		d.netnsModeChangedLocked(ctx, old, inv)
	}
	d.mu.Unlock()
	if changed {
		logInventory(klog.FromContext(ctx), old, inv)
		if d.onInv != nil {
			d.onInv(inv)
		}
	}
	return changed, nil
}

// refreshNodeWideSpecsLocked rewrites the CDI specs of prepared claims that
// stand for "every HCA of the node" (the legacy device), and of the claims
// sharing a pod with them: an HCA added since the prepare is in a restarted
// container, and a vanished one no longer makes the runtime fail on a
// missing device node.
func (d *Driver) refreshNodeWideSpecsLocked(ctx context.Context) {
	if d.cfg.LegacyShares == 0 {
		return
	}
	cp, err := d.store.Load()
	if err != nil {
		return // New reported it; the next successful load retries
	}
	var nodeWide []checkpoint.Claim
	for _, c := range cp.Claims {
		if slices.ContainsFunc(c.Devices, func(dev checkpoint.Device) bool { return d.isLegacy(dev.Device) }) {
			nodeWide = append(nodeWide, c)
		}
	}
	d.rewriteSpecsLocked(klog.FromContext(ctx), cp, func(c checkpoint.Claim) bool {
		return slices.ContainsFunc(nodeWide, func(n checkpoint.Claim) bool { return n.UID == c.UID || sharesPod(c, n) })
	})
}

// logInventory logs the HCAs and the warnings that are new since the last
// pass, so a rescan every few seconds does not repeat itself.
func logInventory(logger klog.Logger, old, inv hca.Inventory) {
	seen := map[string]bool{}
	for _, w := range old.Warnings {
		seen[w] = true
	}
	for _, h := range old.HCAs {
		for _, w := range h.Warnings {
			seen[w] = true
		}
	}
	for _, w := range inv.Warnings {
		if !seen[w] {
			logger.Info("Warning: node-wide RDMA file", "problem", w)
		}
	}
	usable := 0
	for _, h := range inv.HCAs {
		for _, w := range h.Warnings {
			if !seen[w] {
				logger.Info("Warning: HCA file", "hca", h.Name, "problem", w)
			}
		}
		if h.Usable {
			usable++
		} else {
			logger.Info("HCA is not usable", "hca", h.Name, "reason", h.UnusableReason)
		}
	}
	logger.Info("RDMA inventory", "hcas", len(inv.HCAs), "usable", usable, "netnsMode", inv.NetnsMode)
}

// resources is what the current inventory publishes.
func (d *Driver) resourcesLocked() resourceslice.DriverResources {
	return devices.Resources(d.cfg.NodeName, d.inv, devices.Options{
		DriverName: d.cfg.DriverName, Shares: d.cfg.Shares, LegacyShares: d.cfg.LegacyShares,
		HCAHandles: d.cfg.HCAHandles, HCAObjects: d.cfg.HCAObjects,
		TaintedSince: d.taintedSince,
	})
}

// publish hands the slices to the publisher when they differ from what it
// was last given.
func (d *Driver) publish(ctx context.Context) error {
	// Held across PublishResources: with concurrent publishes, a slower
	// one carrying an older inventory must not land last.
	d.pubMu.Lock()
	defer d.pubMu.Unlock()
	d.mu.Lock()
	if d.publisher == nil {
		d.mu.Unlock()
		return nil
	}
	res := d.resourcesLocked()
	if d.published != nil && apiequality.Semantic.DeepEqual(*d.published, res) {
		d.mu.Unlock()
		return nil
	}
	d.published = &res
	p := d.publisher
	d.mu.Unlock()

	if err := p.PublishResources(ctx, res); err != nil {
		d.mu.Lock()
		d.published = nil
		d.mu.Unlock()
		d.metrics.backgroundErrors.WithLabelValues("publish").Inc()
		return err
	}
	devs := 0
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			devs += len(s.Devices)
		}
	}
	d.metrics.publishes.Inc()
	d.metrics.lastPublish.SetToCurrentTime()
	d.metrics.publishedDevices.Set(float64(devs))
	klog.FromContext(ctx).V(2).Info("Published ResourceSlices", "devices", devs)
	return nil
}

// Run rescans every RescanInterval and republishes on change, and retries
// a publish the API server refused, with backoff, until ctx ends.
func (d *Driver) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	interval := d.cfg.RescanInterval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	if ps, ok := d.source.(PortStater); ok && d.cfg.PortPollInterval > 0 {
		go d.watchPorts(ctx, d.cfg.PortPollInterval, ps)
	}
	if d.kernel != nil {
		go d.followKernel(ctx, d.kernel)
	}
	if d.status != nil {
		go d.status.run(ctx)
	}
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			d.sweepSpecs(ctx, time.Now())
		case <-retry:
			retry = nil
		case <-d.retryRequests():
			if retry == nil {
				backoff := d.nextBackoff()
				logger.Info("Republishing ResourceSlices after an error", "in", backoff)
				retry = time.After(backoff)
			}
			continue
		}
		if changed, err := d.rescan(ctx); err != nil {
			logger.Error(err, "Rediscovery failed; keeping the last inventory")
			continue
		} else if changed {
			d.resetBackoff()
		}
		if err := d.publish(ctx); err != nil {
			logger.Error(err, "Publishing ResourceSlices failed")
		}
	}
}

// HandleError is called by the helper for background errors, mostly from
// publishing. Dropped fields and validation errors will not heal by
// themselves (the cluster lacks a feature, or our slice is wrong): they are
// logged and counted, and the slices are published again with backoff
// instead of crash-looping the daemon.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	kind := "publish"
	var dropped *resourceslice.DroppedFieldsError
	fatal := errors.As(err, &dropped) || apierrors.IsInvalid(err)
	if !fatal && !errors.Is(err, kubeletplugin.ErrRecoverable) {
		kind = "other"
	}
	d.metrics.backgroundErrors.WithLabelValues(kind).Inc()
	runtime.HandleErrorWithContext(ctx, err, msg, "fatalForThisPublish", fatal)
	if fatal {
		d.mu.Lock()
		d.published = nil
		d.mu.Unlock()
		select {
		case d.retryCh <- struct{}{}:
		default:
		}
	}
}

func (d *Driver) retryRequests() <-chan struct{} { return d.retryCh }

func (d *Driver) nextBackoff() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.backoff == 0 {
		d.backoff = time.Second
	} else {
		d.backoff = min(2*d.backoff, 5*time.Minute)
	}
	return d.backoff
}

func (d *Driver) resetBackoff() {
	d.mu.Lock()
	d.backoff = 0
	d.mu.Unlock()
}

// Rescan rediscovers the node now, everything read again, and republishes
// if anything changed: kernel events, the port watcher (and tests) call it.
// Run's periodic rescan re-reads only what changes without an event.
func (d *Driver) Rescan(ctx context.Context) error {
	if inv, ok := d.source.(Invalidator); ok {
		inv.Invalidate()
	}
	if _, err := d.rescan(ctx); err != nil {
		return err
	}
	return d.publish(ctx)
}
