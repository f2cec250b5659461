package e2e

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

func TestControlPlaneServesResourceV1(t *testing.T) {
	t.Parallel() // no node: see parallel in main_test.go
	cp, err := cluster.StartControlPlane(t, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	if _, err := cp.Client.ResourceV1().DeviceClasses().List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
}
