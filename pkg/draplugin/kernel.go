package draplugin

// Kernel events on the slow path: a burst of link or address messages or
// uevents (a netdev renamed, an address and so a RoCE GID added, a driver
// reloaded, a VF created) becomes one rescan, so the change is published
// within a second instead of at the next RescanInterval. Every source
// counts: kevents already dropped what cannot matter. The rescan interval
// stays as the safety net, for what the daemon's namespace does not see
// (addresses in pods' namespaces) and what has no event at all.

import (
	"context"
	"errors"
	"time"

	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/kevents"
)

// eventSettle is how long the follower collects events after the first of
// a burst before it rescans. A driver reload registers the PCI function,
// the ib device, its uverbs node and its netdev one after another; one
// rescan after they settle is cheaper than one per step, and the window is
// fixed (not extended by new events) so a noisy node cannot delay a
// rescan indefinitely. It usually also covers ib_core, which updates the
// GID table from a work queue after the address message has gone out;
// addressRecheck covers the rest.
const eventSettle = 100 * time.Millisecond

// addressRecheck is when the follower rescans once more after a burst with
// address events: ib_core fills the GID table from a work queue, which on
// a loaded node may run after the first rescan. One more rescan (about
// 10 ms for 64 HCAs) beats a GID missing until the periodic one.
const addressRecheck = time.Second

// followKernel rescans after each burst of kernel events until ctx ends or
// the channel is closed.
func (p *publisher) followKernel(ctx context.Context, events <-chan kevents.Event) {
	logger := klog.FromContext(ctx)
	var recheck <-chan time.Time
	for {
		var first kevents.Event
		select {
		case <-ctx.Done():
			return
		case <-recheck:
			recheck = nil
			logger.V(4).Info("Rescanning again after address events")
			if err := p.Rescan(ctx); err != nil {
				logger.Error(err, "Rescan after address events failed")
			}
			continue
		case ev, ok := <-events:
			if !ok {
				logger.Info("Kernel events ended; changes are seen by polling only")
				return
			}
			first = ev
		}
		if first.Source == kevents.Failed {
			logger.Error(errors.New(first.Err), "Kernel events stopped for one socket; its changes are seen by polling only", "rescanInterval", p.cfg.RescanInterval)
		}
		n := 1
		address := first.Source == kevents.Address
		p.metrics.kernelEvents.WithLabelValues(string(first.Source)).Inc()
		settle := time.NewTimer(eventSettle)
	collect:
		for {
			select {
			case <-ctx.Done():
				settle.Stop()
				return
			case ev, ok := <-events:
				if !ok {
					break collect
				}
				n++
				address = address || ev.Source == kevents.Address
				p.metrics.kernelEvents.WithLabelValues(string(ev.Source)).Inc()
			case <-settle.C:
				break collect
			}
		}
		logger.V(4).Info("Rescanning after kernel events", "first", first.String(), "events", n)
		if err := p.Rescan(ctx); err != nil {
			logger.Error(err, "Rescan after kernel events failed")
		}
		if address {
			recheck = time.After(addressRecheck)
		}
	}
}
