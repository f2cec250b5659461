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

	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
)

// healthRefresh re-sends health within the kubelet's default 30 s lease.
const healthRefresh = 10 * time.Second

// healthTimeout is the lease the driver asks the kubelet for.
const healthTimeout = 30 * time.Second

// updateTaintsLocked keeps, for every published device with a problem, the
// time it was first seen: the taint's TimeAdded must not move between
// publishes, or every publish would look like a new taint.
func (d *Driver) updateTaintsLocked(now time.Time) {
	if !d.cfg.TaintUnhealthy {
		return
	}
	next := map[string]metav1.Time{}
	for name, h := range d.byDevice {
		if h.Problem() == "" {
			continue
		}
		if since, ok := d.taintedSince[name]; ok {
			next[name] = since
		} else {
			next[name] = metav1.NewTime(now.Truncate(time.Second))
		}
	}
	d.taintedSince = next
}

// healthReportLocked covers every device of the pool: the published ones,
// and the prepared ones that vanished (Unhealthy, so the kubelet shows it
// on the pods that use them).
func (d *Driver) healthReportLocked(now time.Time) kubeletplugin.DeviceHealthReport {
	var r kubeletplugin.DeviceHealthReport
	seen := map[string]bool{}
	for _, name := range sortedKeys(d.byDevice) {
		h := d.byDevice[name]
		dh := kubeletplugin.DeviceHealth{PoolName: d.cfg.NodeName, DeviceName: name, Health: kubeletplugin.HealthStatusHealthy,
			LastUpdated: now, HealthCheckTimeout: healthTimeout}
		if p := h.Problem(); p != "" {
			dh.Health, dh.Message = kubeletplugin.HealthStatusUnhealthy, h.Name+": "+p
		}
		seen[name] = true
		r.Devices = append(r.Devices, dh)
	}
	if d.isLegacy(devices.LegacyDeviceName) {
		dh := kubeletplugin.DeviceHealth{PoolName: d.cfg.NodeName, DeviceName: devices.LegacyDeviceName, Health: kubeletplugin.HealthStatusUnhealthy,
			Message: "no HCA has an ACTIVE port", LastUpdated: now, HealthCheckTimeout: healthTimeout}
		for _, h := range d.byDevice {
			if h.AnyPortActive() {
				dh.Health, dh.Message = kubeletplugin.HealthStatusHealthy, ""
				break
			}
		}
		seen[dh.DeviceName] = true
		r.Devices = append(r.Devices, dh)
	}
	if cp, err := d.store.Load(); err == nil {
		for _, uid := range sortedKeys(cp.Claims) {
			for _, dev := range cp.Claims[uid].Devices {
				if seen[dev.Device] || dev.Pool != d.cfg.NodeName {
					continue
				}
				seen[dev.Device] = true
				r.Devices = append(r.Devices, kubeletplugin.DeviceHealth{PoolName: dev.Pool, DeviceName: dev.Device,
					Health: kubeletplugin.HealthStatusUnhealthy, Message: dev.IBDev + " is no longer on the node",
					LastUpdated: now, HealthCheckTimeout: healthTimeout})
			}
		}
	}
	return r
}

// notifyHealthLocked wakes the health watchers after an inventory change.
func (d *Driver) notifyHealthLocked() {
	close(d.healthChanged)
	d.healthChanged = make(chan struct{})
	d.metrics.deviceHealthy.Reset() // vanished devices drop out
	for name, h := range d.byDevice {
		v := 1.0
		if h.Problem() != "" {
			v = 0
		}
		d.metrics.deviceHealthy.WithLabelValues(name).Set(v)
	}
}

// WatchHealthStatus sends the health of every device at once, again on
// every change, and at least every 10 s so the kubelet's 30 s lease never
// lapses, until ctx ends.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	logger := klog.FromContext(ctx)
	ticker := time.NewTicker(healthRefresh)
	defer ticker.Stop()
	for {
		d.mu.Lock()
		report := d.healthReportLocked(time.Now())
		changed := d.healthChanged
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
			logger.V(5).Info("Sent device health", "devices", len(report.Devices))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-ticker.C:
		}
	}
}

// watchPorts polls the port state files every interval and rescans as soon
// as one changes, so a link going down reaches the slices and the kubelet
// well within a second, without a full discovery several times a second.
func (d *Driver) watchPorts(ctx context.Context, interval time.Duration, ports PortStater) {
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
		cur, err := ports.PortStates()
		if err != nil || (last != nil && equalStates(cur, last)) {
			continue
		}
		last = cur
		if err := d.Rescan(ctx); err != nil {
			logger.Error(err, "Rescan after a port change failed")
		}
	}
}

// PortStater is the cheap change detector: *hca.Discoverer.
type PortStater interface {
	PortStates() (map[string]string, error)
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
