package draplugin_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
)

// BenchmarkPrepare measures a prepare and its unprepare through the real
// gRPC socket and the helper (which GETs each claim from the API server, a
// fake one here). "fsync" is the production path; "no-fsync" drops the
// checkpoint's fsync and is the lower bound. Latency percentiles are of
// single prepare calls.
func BenchmarkPrepare(b *testing.B) {
	for _, fsync := range []bool{true, false} {
		for _, inFlight := range []int{1, 32} {
			name := fmt.Sprintf("fsync=%v/inflight=%d", fsync, inFlight)
			b.Run(name, func(b *testing.B) { benchPrepare(b, fsync, inFlight) })
		}
	}
}

func benchPrepare(b *testing.B, fsync bool, inFlight int) {
	e := newEnv(b)
	e.cfg.AllowNonHostNetwork = true
	if !fsync {
		e.deps.storeOpts = []checkpoint.Option{checkpoint.BootScoped()}
	}
	e.start()
	// One claim per HCA and worker slot; workers take claims round-robin so
	// no two in-flight claims hold the same HCA.
	devices := []string{"mlx5-0", "mlx5-1", "mlx5-2", "mlx5-3", "mlx5-4", "mlx5-5", "mlx5-6", "mlx5-7", "mlx5-8", "mlx5-9"}
	var claims []*resourceapi.ResourceClaim
	for i := range inFlight {
		claims = append(claims, e.claim(fmt.Sprintf("bench-%d", i), (*corev1.Pod)(nil), []allocated{{request: "hca", device: devices[i%len(devices)], admin: inFlight > len(devices)}}))
	}
	var mu sync.Mutex
	var lat []time.Duration
	record := func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		lat = append(lat, d)
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for w := range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := claims[w]
			req := &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref(c)}}
			unreq := &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref(c)}}
			for range work {
				start := time.Now()
				resp, err := e.dra.NodePrepareResources(context.Background(), req)
				d := time.Since(start)
				if err != nil || resp.Claims[string(c.UID)].Error != "" {
					b.Errorf("prepare: %v %v", err, resp)
					return
				}
				if _, err := e.dra.NodeUnprepareResources(context.Background(), unreq); err != nil {
					b.Errorf("unprepare: %v", err)
					return
				}
				record(d)
			}
		}()
	}
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		work <- 1
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "claims/s")
}
