package draplugin

// The slow path: discovery and publishing. Nothing here runs inside a
// kubelet call; a prepare only reads the latest view.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// publisher owns the inventory: it discovers the node's HCAs, keeps the
// latest view, and publishes slices, taints and device health from it.
type publisher struct {
	cfg     *Config
	source  HCASource
	store   CheckpointStore // read for moved HCAs and vanished prepared devices
	metrics *Metrics
	onInv   func(hca.Inventory)
	// onChange sees every new view after the first: the claim state
	// rewrites the specs that depend on what changed.
	onChange func(ctx context.Context, old, cur *view)

	// scanMu orders rescans: the ticker, the port watcher and kernel
	// events may ask at once, and a slower discovery must not swap in an
	// older view after a newer one.
	scanMu sync.Mutex
	// pubMu orders publishes the same way; held across PublishResources.
	pubMu sync.Mutex
	cur   atomic.Pointer[view]

	retryCh chan struct{}
	mu      sync.Mutex // guards the fields below
	helper  SlicePublisher
	// published is what helper was last given, nil when it must be
	// given again.
	published *resourceslice.DriverResources
	backoff   time.Duration // of the next republish after a refused one
}

func newPublisher(cfg *Config, source HCASource, store CheckpointStore, metrics *Metrics, onInv func(hca.Inventory)) *publisher {
	p := &publisher{cfg: cfg, source: source, store: store, metrics: metrics, onInv: onInv, retryCh: make(chan struct{}, 1)}
	p.cur.Store(&view{replaced: make(chan struct{})})
	return p
}

// current is the latest view.
func (p *publisher) current() *view { return p.cur.Load() }

// rescan rediscovers the node and swaps in a new view if anything a claim
// or a slice depends on changed, which it reports.
func (p *publisher) rescan(ctx context.Context) (bool, error) {
	p.scanMu.Lock()
	defer p.scanMu.Unlock()
	inv, err := p.source.Discover()
	if err != nil {
		p.metrics.backgroundErrors.WithLabelValues("discovery").Inc()
		return false, err
	}
	old := p.current()
	p.keepMoved(ctx, old.inv, &inv)
	// The first inventory always counts as a change, even an empty one: the
	// device-plugin shim waits for it.
	if old.gen > 0 && apiequality.Semantic.DeepEqual(old.inv, inv) {
		return false, nil
	}
	cur := &view{gen: old.gen + 1, inv: inv, byDevice: devices.Published(inv), replaced: make(chan struct{})}
	cur.taintedSince = taints(p.cfg, old, cur, time.Now())
	p.cur.Store(cur)
	close(old.replaced)
	p.healthMetrics(cur)
	if old.gen > 0 && p.onChange != nil {
		p.onChange(ctx, old, cur)
	}
	logInventory(klog.FromContext(ctx), old.inv, inv)
	if p.onInv != nil {
		p.onInv(inv)
	}
	return true, nil
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

// resources is what v publishes.
func (p *publisher) resources(v *view) resourceslice.DriverResources {
	return devices.Resources(p.cfg.NodeName, v.inv, devices.Options{
		DriverName: p.cfg.DriverName, Shares: p.cfg.Shares, LegacyShares: p.cfg.LegacyShares,
		HCAHandles: p.cfg.Limits.Handles, HCAObjects: p.cfg.Limits.Objects, ClaimMaxPercent: p.cfg.Limits.ClaimMaxPercent,
		TaintedSince: v.taintedSince,
	})
}

// setPublisher hands the publisher the helper once it is started, and
// publishes the current view.
func (p *publisher) setPublisher(ctx context.Context, helper SlicePublisher) error {
	p.setHelper(helper)
	return p.publish(ctx)
}

func (p *publisher) setHelper(helper SlicePublisher) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.helper, p.published = helper, nil
}

// publish hands the slices to the helper when they differ from what it
// was last given.
func (p *publisher) publish(ctx context.Context) error {
	// Held across PublishResources: with concurrent publishes, a slower
	// one carrying an older inventory must not land last.
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	helper, res := p.unpublished()
	if helper == nil {
		return nil
	}
	if err := helper.PublishResources(ctx, res); err != nil {
		p.forgetPublished()
		p.metrics.backgroundErrors.WithLabelValues("publish").Inc()
		return err
	}
	devs := 0
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			devs += len(s.Devices)
		}
	}
	p.metrics.publishes.Inc()
	p.metrics.lastPublish.SetToCurrentTime()
	p.metrics.publishedDevices.Set(float64(devs))
	klog.FromContext(ctx).V(2).Info("Published ResourceSlices", "devices", devs)
	return nil
}

// unpublished returns the helper and the slices of the current view, and
// marks them published, or no helper when there is none or it has them.
func (p *publisher) unpublished() (SlicePublisher, resourceslice.DriverResources) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.helper == nil {
		return nil, resourceslice.DriverResources{}
	}
	res := p.resources(p.current())
	if p.published != nil && apiequality.Semantic.DeepEqual(*p.published, res) {
		return nil, resourceslice.DriverResources{}
	}
	p.published = &res
	return p.helper, res
}

func (p *publisher) forgetPublished() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.published = nil
}

// run rescans every RescanInterval and republishes on change, calls sweep
// on the same ticks, and retries a publish the API server refused, with
// backoff, until ctx ends. It starts the port watcher.
func (p *publisher) run(ctx context.Context, sweep func()) {
	logger := klog.FromContext(ctx)
	interval := p.cfg.RescanInterval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	if p.cfg.PortPollInterval > 0 {
		go p.watchPorts(ctx, p.cfg.PortPollInterval)
	}
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			sweep()
		case <-retry:
			retry = nil
		case <-p.retryCh:
			if retry == nil {
				backoff := p.nextBackoff()
				logger.Info("Republishing ResourceSlices after an error", "in", backoff)
				retry = time.After(backoff)
			}
			continue
		}
		if changed, err := p.rescan(ctx); err != nil {
			logger.Error(err, "Rediscovery failed; keeping the last inventory")
			continue
		} else if changed {
			p.resetBackoff()
		}
		if err := p.publish(ctx); err != nil {
			logger.Error(err, "Publishing ResourceSlices failed")
		}
	}
}

// handleError is called by the helper for background errors, mostly from
// publishing. Dropped fields and validation errors will not heal by
// themselves (the cluster lacks a feature, or our slice is wrong): they are
// logged and counted, and the slices are published again with backoff
// instead of crash-looping the daemon.
func (p *publisher) handleError(ctx context.Context, err error, msg string) {
	kind := "publish"
	var dropped *resourceslice.DroppedFieldsError
	fatal := errors.As(err, &dropped) || apierrors.IsInvalid(err)
	if !fatal && !errors.Is(err, kubeletplugin.ErrRecoverable) {
		kind = "other"
	}
	p.metrics.backgroundErrors.WithLabelValues(kind).Inc()
	runtime.HandleErrorWithContext(ctx, err, msg, "fatalForThisPublish", fatal)
	if fatal {
		p.forgetPublished()
		select {
		case p.retryCh <- struct{}{}:
		default:
		}
	}
}

func (p *publisher) nextBackoff() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.backoff == 0 {
		p.backoff = time.Second
	} else {
		p.backoff = min(2*p.backoff, 5*time.Minute)
	}
	return p.backoff
}

func (p *publisher) resetBackoff() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backoff = 0
}

// Rescan rediscovers the node now, everything read again, and republishes
// if anything changed.
func (p *publisher) Rescan(ctx context.Context) error {
	p.source.Invalidate()
	if _, err := p.rescan(ctx); err != nil {
		return err
	}
	return p.publish(ctx)
}
