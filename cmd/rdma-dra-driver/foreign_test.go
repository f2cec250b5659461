package main

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
)

// TestForeignAdvertiser: the ACK plugin still advertising rdma/hca on a
// node served by the DRA route is reported and raises the gauge; once it
// is removed (allocatable 0) both clear.
func TestForeignAdvertiser(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dgx01"},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{"rdma/hca": resource.MustParse("1k")}}}
	client := fake.NewClientset(node)
	reg := metrics.NewKubeRegistry()
	f := newForeignAdvertiser(client.CoreV1().Nodes(), &options{nodeName: "dgx01", legacyResourceName: "rdma/hca", legacyRoute: "dra", sharing: "shared"}, reg)
	ctx := context.Background()
	problem, err := f.check(ctx)
	if err != nil || !strings.Contains(problem, "node dgx01 advertises rdma/hca=1k") {
		t.Fatalf("check = %q, %v", problem, err)
	}
	gauge := func() float64 {
		t.Helper()
		v, err := testutil.GetGaugeMetricValue(f.gauge.GaugeMetric)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := gauge(); v != 1 {
		t.Errorf("gauge = %v with the old plugin present, want 1", v)
	}
	node.Status.Allocatable["rdma/hca"] = resource.MustParse("0")
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if problem, err := f.check(ctx); problem != "" || err != nil {
		t.Errorf("after removal: %q, %v", problem, err)
	}
	if v := gauge(); v != 0 {
		t.Errorf("gauge = %v after removal, want 0", v)
	}
	if _, err := (&foreignAdvertiser{nodes: client.CoreV1().Nodes(), node: "gone", gauge: f.gauge}).check(ctx); err == nil {
		t.Error("a missing Node gave no error")
	}
}
