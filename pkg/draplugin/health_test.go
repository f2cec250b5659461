package draplugin_test

import (
	"context"
	"maps"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kwait "k8s.io/apimachinery/pkg/util/wait"
	healthpb "k8s.io/kubelet/pkg/apis/dra-health/v1"
)

// TestHealthAndTaints: the kubelet's health stream starts with every
// device Healthy; a port going DOWN (noticed by the port watcher, no manual
// rescan) makes that device Unhealthy with the port named, taints it
// NoSchedule in the published slice, and both clear when it recovers.
func TestHealthAndTaints(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.cfg.PortPollInterval = 50 * time.Millisecond
	e.start()
	conn, err := grpc.NewClient("unix://"+filepath.Join(e.pluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := healthpb.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &healthpb.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	health := func() map[string]*healthpb.DeviceHealth {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("health stream: %v", err)
		}
		out := map[string]*healthpb.DeviceHealth{}
		for _, d := range resp.Devices {
			out[d.Device.DeviceName] = d
		}
		return out
	}
	first := health()
	if len(first) != 10 {
		t.Fatalf("initial report covers %d devices, want 10", len(first))
	}
	for name, d := range first {
		if d.Health != healthpb.HealthStatus_HEALTHY || d.Device.PoolName != nodeName || d.HealthCheckTimeoutSeconds != 30 {
			t.Errorf("%s: %v pool %s timeout %d", name, d.Health, d.Device.PoolName, d.HealthCheckTimeoutSeconds)
		}
	}

	if err := e.node.SetPortState("mlx5_3", 1, "1: DOWN", "2: Polling"); err != nil {
		t.Fatal(err)
	}
	for {
		r := health()
		if r["mlx5-3"] == nil || r["mlx5-2"] == nil {
			t.Fatalf("a health report without mlx5-3 or mlx5-2: %v", r)
		}
		if d := r["mlx5-3"]; d.Health == healthpb.HealthStatus_UNHEALTHY {
			if d.Message != "mlx5_3: port 1 is DOWN (Polling)" {
				t.Errorf("message %q", d.Message)
			}
			if r["mlx5-2"].Health != healthpb.HealthStatus_HEALTHY {
				t.Errorf("mlx5-2 became %v", r["mlx5-2"].Health)
			}
			break
		}
	}
	e.waitSliceTaints(t, map[string]string{"mlx5-3": "rdma.dra.dev/port-down=DOWN:NoSchedule"})

	if err := e.node.SetPortState("mlx5_3", 1, "4: ACTIVE", "5: LinkUp"); err != nil {
		t.Fatal(err)
	}
	for {
		d := health()["mlx5-3"]
		if d == nil {
			t.Fatal("a health report without mlx5-3")
		}
		if d.Health == healthpb.HealthStatus_HEALTHY {
			break
		}
	}
	e.waitSliceTaints(t, map[string]string{})
}

func (e *env) waitSliceTaints(t *testing.T, want map[string]string) {
	t.Helper()
	var got map[string]string
	err := kwait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := e.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		got = taintsOf(list.Items)
		return maps.Equal(got, want), nil
	})
	if err != nil {
		t.Errorf("slice taints = %v, want %v (%v)", got, want, err)
	}
}

func taintsOf(slices []resourceapi.ResourceSlice) map[string]string {
	out := map[string]string{}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			for _, tn := range d.Taints {
				out[d.Name] = tn.Key + "=" + tn.Value + ":" + string(tn.Effect)
			}
		}
	}
	return out
}
