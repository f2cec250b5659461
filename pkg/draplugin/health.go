package draplugin

// Device health: the kubelet's view (WatchHealthStatus) and the fast port
// watcher that notices a link change between full rescans. Both are on the
// slow path; neither blocks a prepare.

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
)

// healthRefresh re-sends health within the kubelet's default 30 s lease.
const healthRefresh = 10 * time.Second

// healthTimeout is the lease the driver asks the kubelet for.
const healthTimeout = 30 * time.Second

// taints returns, for every published device of cur with a problem, the
// time it was first seen, kept from old: the taint's TimeAdded must not
// move between publishes, or every publish would look like a new taint.
func taints(cfg *Config, old, cur *view, now time.Time) map[string]metav1.Time {
	if !cfg.TaintUnhealthy {
		return nil
	}
	next := map[string]metav1.Time{}
	for name, h := range cur.byDevice {
		if h.Problem() == "" {
			continue
		}
		if since, ok := old.taintedSince[name]; ok {
			next[name] = since
		} else {
			next[name] = metav1.NewTime(now.Truncate(time.Second))
		}
	}
	return next
}

// healthReport covers every device of the pool: the published ones of v,
// and the prepared ones of cp that vanished (Unhealthy, so the kubelet
// shows it on the pods that use them).
func (p *publisher) healthReport(v *view, cp checkpoint.Checkpoint, now time.Time) kubeletplugin.DeviceHealthReport {
	var r kubeletplugin.DeviceHealthReport
	seen := map[string]bool{}
	for _, name := range sortedKeys(v.byDevice) {
		h := v.byDevice[name]
		dh := kubeletplugin.DeviceHealth{PoolName: p.cfg.NodeName, DeviceName: name, Health: kubeletplugin.HealthStatusHealthy,
			LastUpdated: now, HealthCheckTimeout: healthTimeout}
		if p := h.Problem(); p != "" {
			dh.Health, dh.Message = kubeletplugin.HealthStatusUnhealthy, h.Name+": "+p
		}
		seen[name] = true
		r.Devices = append(r.Devices, dh)
	}
	if p.cfg.isLegacy(devices.LegacyDeviceName) {
		dh := kubeletplugin.DeviceHealth{PoolName: p.cfg.NodeName, DeviceName: devices.LegacyDeviceName, Health: kubeletplugin.HealthStatusUnhealthy,
			Message: "no HCA has an ACTIVE port", LastUpdated: now, HealthCheckTimeout: healthTimeout}
		for _, h := range v.byDevice {
			if h.AnyPortActive() {
				dh.Health, dh.Message = kubeletplugin.HealthStatusHealthy, ""
				break
			}
		}
		seen[dh.DeviceName] = true
		r.Devices = append(r.Devices, dh)
	}
	for _, uid := range sortedKeys(cp.Claims) {
		for _, dev := range cp.Claims[uid].Devices {
			if seen[dev.Device] || dev.Pool != p.cfg.NodeName {
				continue
			}
			seen[dev.Device] = true
			r.Devices = append(r.Devices, kubeletplugin.DeviceHealth{PoolName: dev.Pool, DeviceName: dev.Device,
				Health: kubeletplugin.HealthStatusUnhealthy, Message: dev.IBDev + " is no longer on the node",
				LastUpdated: now, HealthCheckTimeout: healthTimeout})
		}
	}
	return r
}

// healthMetrics sets device_healthy from a new view.
func (p *publisher) healthMetrics(v *view) {
	p.metrics.deviceHealthy.Reset() // vanished devices drop out
	for name, h := range v.byDevice {
		healthy := 1.0
		if h.Problem() != "" {
			healthy = 0
		}
		p.metrics.deviceHealthy.WithLabelValues(name).Set(healthy)
	}
}

// watchHealth sends the health of every device at once, again on every
// new view, and at least every healthRefresh, until ctx ends.
func (p *publisher) watchHealth(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	logger := klog.FromContext(ctx)
	ticker := time.NewTicker(healthRefresh)
	defer ticker.Stop()
	for {
		v := p.current()
		cp, err := p.store.Load()
		if err != nil {
			cp = checkpoint.Checkpoint{} // New reported it; the next load retries
		}
		report := p.healthReport(v, cp, time.Now())
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
			logger.V(5).Info("Sent device health", "devices", len(report.Devices))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-v.replaced:
		case <-ticker.C:
		}
	}
}

// watchPorts polls the port state files every interval and rescans as soon
// as one changes, so a link going down reaches the slices and the kubelet
// well within a second, without a full discovery several times a second.
func (p *publisher) watchPorts(ctx context.Context, interval time.Duration) {
	logger := klog.FromContext(ctx)
	// No baseline: the first tick rescans once, so a change between the
	// last discovery and this watcher's start is not missed.
	var last map[string]string
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		cur, err := p.source.PortStates()
		if err != nil || (last != nil && equalStates(cur, last)) {
			continue
		}
		last = cur
		if err := p.Rescan(ctx); err != nil {
			logger.Error(err, "Rescan after a port change failed")
		}
	}
}

func equalStates(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
