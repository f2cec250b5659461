package draplugin

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-base/metrics"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// Metrics are the driver's Prometheus metrics, in a registry of their own
// so that several drivers in one test process do not collide.
type Metrics struct {
	Registry metrics.KubeRegistry

	prepareTotal      *metrics.CounterVec
	prepareDuration   *metrics.HistogramVec
	unprepareTotal    *metrics.CounterVec
	unprepareDuration *metrics.HistogramVec
	publishedDevices  *metrics.Gauge
	publishes         *metrics.Counter
	backgroundErrors  *metrics.CounterVec
	deviceHealthy     *metrics.GaugeVec
	lastPublish       *metrics.Gauge
	kernelEvents      *metrics.CounterVec
	netnsNotReturned  *metrics.CounterVec
	rebootDiscarded   *metrics.Counter
	prepareRepeated   *metrics.Counter
}

const namespace = "rdma_dra"

// NewMetrics registers the driver's metrics in a new registry.
func NewMetrics() *Metrics {
	latency := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	m := &Metrics{
		Registry: metrics.NewKubeRegistry(),
		prepareTotal: metrics.NewCounterVec(&metrics.CounterOpts{Namespace: namespace, Name: "prepare_claims_total",
			Help: "Claims prepared, by result.", StabilityLevel: metrics.ALPHA}, []string{"result"}),
		prepareDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{Namespace: namespace, Name: "prepare_duration_seconds",
			Help: "Latency of NodePrepareResources calls, by result.", Buckets: latency, StabilityLevel: metrics.ALPHA}, []string{"result"}),
		unprepareTotal: metrics.NewCounterVec(&metrics.CounterOpts{Namespace: namespace, Name: "unprepare_claims_total",
			Help: "Claims unprepared, by result.", StabilityLevel: metrics.ALPHA}, []string{"result"}),
		unprepareDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{Namespace: namespace, Name: "unprepare_duration_seconds",
			Help: "Latency of NodeUnprepareResources calls, by result.", Buckets: latency, StabilityLevel: metrics.ALPHA}, []string{"result"}),
		publishedDevices: metrics.NewGauge(&metrics.GaugeOpts{Namespace: namespace, Name: "published_devices",
			Help: "Devices in the ResourceSlices last handed to the publisher.", StabilityLevel: metrics.ALPHA}),
		publishes: metrics.NewCounter(&metrics.CounterOpts{Namespace: namespace, Name: "publishes_total",
			Help: "ResourceSlice publishes (only changed inventories are published).", StabilityLevel: metrics.ALPHA}),
		backgroundErrors: metrics.NewCounterVec(&metrics.CounterOpts{Namespace: namespace, Name: "background_errors_total",
			Help: "Errors outside of gRPC calls, by kind (publish, discovery, checkpoint, cdi, netns).", StabilityLevel: metrics.ALPHA}, []string{"kind"}),
		deviceHealthy: metrics.NewGaugeVec(&metrics.GaugeOpts{Namespace: namespace, Name: "device_healthy",
			Help: "1 when every port of the device is ACTIVE with its link up, 0 otherwise.", StabilityLevel: metrics.ALPHA}, []string{"device"}),
		lastPublish: metrics.NewGauge(&metrics.GaugeOpts{Namespace: namespace, Name: "last_publish_timestamp_seconds",
			Help: "When ResourceSlices were last handed to the publisher (time since = now - this).", StabilityLevel: metrics.ALPHA}),
		kernelEvents: metrics.NewCounterVec(&metrics.CounterOpts{Namespace: namespace, Name: "kernel_events_total",
			Help: "Kernel notifications that triggered a rescan, by source (link, address, uevent, overflow, failed).", StabilityLevel: metrics.ALPHA}, []string{"source"}),
		prepareRepeated: metrics.NewCounter(&metrics.CounterOpts{Namespace: namespace, Name: "prepare_repeated_claims_total",
			Help: "Claims prepared successfully that the checkpoint already held: the kubelet asking again (after its restart, a failed call, or across a rolling update). Included in prepare_claims_total.", StabilityLevel: metrics.ALPHA}),
		netnsNotReturned: metrics.NewCounterVec(&metrics.CounterOpts{Namespace: namespace, Name: "netns_not_returned_total",
			Help: "HCAs moved into a pod's network namespace (exclusive netns mode) that were not back in the host's when their claim was unprepared, by device.", StabilityLevel: metrics.ALPHA}, []string{"hca"}),
	}
	m.Registry.MustRegister(m.prepareTotal, m.prepareDuration, m.unprepareTotal, m.unprepareDuration,
		m.publishedDevices, m.publishes, m.backgroundErrors, m.deviceHealthy, m.lastPublish, m.kernelEvents, m.netnsNotReturned, m.prepareRepeated)
	m.registerRebootMetrics()
	return m
}

func resultLabel(err error) string {
	if err != nil {
		return "error"
	}
	return "success"
}

func (m *Metrics) observe(total *metrics.CounterVec, dur *metrics.HistogramVec, results map[types.UID]kubeletplugin.PrepareResult, start time.Time) {
	errs := make(map[types.UID]error, len(results))
	for uid, r := range results {
		errs[uid] = r.Err
	}
	m.observeErrs(total, dur, errs, start)
}

func (m *Metrics) observeErrs(total *metrics.CounterVec, dur *metrics.HistogramVec, results map[types.UID]error, start time.Time) {
	var callErr error
	for _, err := range results {
		total.WithLabelValues(resultLabel(err)).Inc()
		if err != nil {
			callErr = err
		}
	}
	dur.WithLabelValues(resultLabel(callErr)).Observe(time.Since(start).Seconds())
}
