package main

import (
	"k8s.io/component-base/metrics"

	"github.com/rdma-dra/rdma-dra-driver/internal/buildinfo"
)

// registerBuildInfo adds rdma_dra_build_info, always 1, its labels naming
// the build: the pattern of the Kubernetes components' build_info, so a
// query can join any series with the version that produced it.
func registerBuildInfo(r metrics.KubeRegistry, v buildinfo.Info) {
	g := metrics.NewGauge(&metrics.GaugeOpts{
		Namespace:      "rdma_dra",
		Name:           "build_info",
		Help:           "A metric with a constant '1' value labeled by the driver's version, commit and Go version.",
		StabilityLevel: metrics.ALPHA,
		ConstLabels:    map[string]string{"version": v.Version, "commit": v.Commit, "go_version": v.GoVersion},
	})
	r.MustRegister(g)
	// After registering: component-base metrics ignore a Set before it.
	g.Set(1)
}
