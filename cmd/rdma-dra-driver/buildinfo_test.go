package main

import (
	"strings"
	"testing"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"

	"github.com/rdma-dra/rdma-dra-driver/internal/buildinfo"
)

func TestBuildInfoMetric(t *testing.T) {
	r := metrics.NewKubeRegistry()
	registerBuildInfo(r, buildinfo.Info{Version: "0.2.0", Commit: "5658f81283cce31d189f481366f6817d641f6317", GoVersion: "go1.26.0"})
	want := `
# HELP rdma_dra_build_info [ALPHA] A metric with a constant '1' value labeled by the driver's version, commit and Go version.
# TYPE rdma_dra_build_info gauge
rdma_dra_build_info{commit="5658f81283cce31d189f481366f6817d641f6317",go_version="go1.26.0",version="0.2.0"} 1
`
	if err := testutil.GatherAndCompare(r, strings.NewReader(want), "rdma_dra_build_info"); err != nil {
		t.Error(err)
	}
}
