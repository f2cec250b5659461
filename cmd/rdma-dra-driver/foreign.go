package main

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/legacy"
)

// foreignCheckInterval: an old device plugin is a migration leftover, not
// an emergency; a look at the Node every few minutes is enough to notice
// it.
const foreignCheckInterval = 5 * time.Minute

// foreignAdvertiser watches the Node for the legacy resource advertised by
// another device plugin, logs each change of verdict and keeps a gauge for
// alerts.
type foreignAdvertiser struct {
	nodes                        nodeGetter
	node, resource, route, share string
	gauge                        *metrics.Gauge
	last                         string
}

// nodeGetter reads a Node: cachedNodes in the daemon.
type nodeGetter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error)
}

func newForeignAdvertiser(nodes nodeGetter, o *options, reg metrics.KubeRegistry) *foreignAdvertiser {
	g := metrics.NewGauge(&metrics.GaugeOpts{Namespace: "rdma_dra", Name: "foreign_legacy_resource",
		Help: "1 while the node advertises the legacy resource (rdma/hca) from another device plugin in a way that conflicts with this daemon's mode.", StabilityLevel: metrics.ALPHA})
	reg.MustRegister(g)
	return &foreignAdvertiser{nodes: nodes, node: o.nodeName, resource: o.legacyResourceName, route: string(o.legacyRoute), share: string(o.sharing), gauge: g}
}

// check reads the Node once and returns the problem, "" if none.
func (f *foreignAdvertiser) check(ctx context.Context) (string, error) {
	node, err := f.nodes.Get(ctx, f.node, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	problem := legacy.ForeignAdvertiser(node, f.resource, f.route, f.share)
	if problem != "" {
		f.gauge.Set(1)
	} else {
		f.gauge.Set(0)
	}
	return problem, nil
}

func (f *foreignAdvertiser) run(ctx context.Context, interval time.Duration) {
	logger := klog.FromContext(ctx)
	for {
		problem, err := f.check(ctx)
		switch {
		case err != nil:
			logger.V(2).Info("Cannot check the Node for another device plugin", "err", err)
		case problem != f.last && problem != "":
			logger.Info("Warning: another device plugin serves the legacy resource", "problem", problem)
		case problem != f.last:
			logger.Info("The other device plugin no longer advertises the legacy resource", "resource", f.resource)
		}
		if err == nil {
			f.last = problem
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}
