package prepbench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// sustainedClaims is how many claims BenchmarkPrepareSustained prepares
// back to back: more than a client's default burst of API calls.
const sustainedClaims = 300

// BenchmarkPrepareSustained prepares (and unprepares) sustainedClaims
// claims back to back through the daemon's plugin socket and, interleaved
// claim by claim, the same claims through the minimal driver's (which goes
// first on every other claim), against the same API server; it prints the
// p50 of each prepare, and the API calls per claim of the daemon alone
// (one more run of the claims through it, untimed).
// Interleaved, both see the same load: on 2 shared cores the load swings
// within seconds, and a floor timed before the daemon (as this benchmark
// once did) gave ratios from 0.7x to 1.8x on one tree. Run it with
// -benchtime=1x (make bench does).
func BenchmarkPrepareSustained(b *testing.B) {
	w := newWorld(b, sustainedClaims)
	ctx := context.Background()
	var daemonLat, floorLat []time.Duration
	var calls string
	for b.Loop() {
		d, f, err := interleaved(ctx, w.dra, w.floor, w.claims)
		if err != nil {
			b.Fatal(err)
		}
		daemonLat, floorLat = append(daemonLat, d...), append(floorLat, f...)
		// The API server counts both drivers' calls: the daemon's are
		// counted in a run of its own, untimed.
		before, err := w.apiCalls(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range w.claims {
			if _, err := cycle(ctx, w.dra, c); err != nil {
				b.Fatalf("daemon: %v", err)
			}
		}
		after, err := w.apiCalls(ctx)
		if err != nil {
			b.Fatal(err)
		}
		calls = perClaim(before, after, len(w.claims))
	}
	b.StopTimer()
	d, f := p50ms(daemonLat), p50ms(floorLat)
	b.ReportMetric(d, "p50-ms")
	b.ReportMetric(f, "floor-p50-ms")
	b.ReportMetric(d/f, "x-floor")
	fmt.Printf("prepare sustained: p50 %.2f ms over %d claims, minimal driver %.2f ms (%.2fx; p90 %.2f ms, minimal %.2f ms; load %s)\n",
		d, sustainedClaims, f, d/f, pms(daemonLat, 0.9), pms(floorLat, 0.9), loadAvg())
	fmt.Printf("prepare sustained: API calls per claim while the daemon prepared: %s\n", calls)
}

// interleaved runs a cycle per claim through dra and through floor, one
// claim after the other, floor first on even claims, and returns the
// prepare latencies of each.
func interleaved(ctx context.Context, dra, floor drapb.DRAPluginClient, claims []*drapb.Claim) (daemon, minimal []time.Duration, err error) {
	for i, c := range claims {
		order := []drapb.DRAPluginClient{floor, dra}
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, client := range order {
			d, err := cycle(ctx, client, c)
			switch {
			case err != nil && client == floor:
				return nil, nil, fmt.Errorf("minimal driver: %w", err)
			case err != nil:
				return nil, nil, fmt.Errorf("daemon: %w", err)
			case client == floor:
				minimal = append(minimal, d)
			default:
				daemon = append(daemon, d)
			}
		}
	}
	return daemon, minimal, nil
}

// concurrentClaims are prepared at each level of BenchmarkPrepareConcurrent:
// a multiple of 16 and of hcaCount, and the three levels' claim GETs (288)
// within the burst of the daemon's kubelet-path client (300): the levels
// compare concurrency, not the client's rate limit.
const concurrentClaims = 96

// refill is the pause before each level: the kubelet-path client's bucket
// (50 QPS) takes back the previous level's concurrentClaims tokens.
const refill = 2 * time.Second

// BenchmarkPrepareConcurrent prepares and unprepares concurrentClaims
// claims through the daemon's plugin socket with 1, 4 and 16 calls in
// flight (slot k of n takes claims k, k+n, ...: no two slots ever want
// one HCA) and prints the claims/s of 16 in flight over that of 1, with
// the load average. For each level it also prints where a prepare's time
// went: at the socket, and inside the driver (its prepare_duration
// metric); the rest is the helper's claim GET and its wait for the
// helper's serialization lock. Run it with -benchtime=1x.
func BenchmarkPrepareConcurrent(b *testing.B) {
	w := newWorld(b, concurrentClaims)
	ctx := context.Background()
	levels := []int{1, 4, 16}
	rate := map[int]float64{}
	var notes []string
	for b.Loop() {
		notes = notes[:0]
		for _, n := range levels {
			time.Sleep(refill)
			sum0, err := w.daemonMetric(ctx, "rdma_dra_prepare_duration_seconds_sum")
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			lat, err := inFlight(ctx, w.dra, w.claims, n)
			if err != nil {
				b.Fatalf("%d in flight: %v", n, err)
			}
			el := time.Since(start)
			sum1, err := w.daemonMetric(ctx, "rdma_dra_prepare_duration_seconds_sum")
			if err != nil {
				b.Fatal(err)
			}
			rate[n] = float64(len(lat)) / el.Seconds()
			inDriver := (sum1 - sum0) * 1000 / float64(len(lat))
			notes = append(notes, fmt.Sprintf("%d in flight: %.0f claims/s, prepare p50 %.2f ms at the socket, mean %.2f ms in the driver",
				n, rate[n], p50ms(lat), inDriver))
		}
	}
	b.StopTimer()
	for _, n := range levels {
		b.ReportMetric(rate[n], fmt.Sprintf("claims/s-%d", n))
	}
	x := rate[16] / rate[1]
	b.ReportMetric(x, "x-16-over-1")
	for _, n := range notes {
		fmt.Printf("prepare concurrency: %s\n", n)
	}
	fmt.Printf("prepare concurrency: 16 in flight = %.2fx the claims/s of 1 in flight (load %s)\n", x, loadAvg())
}

// inFlight runs cycles over claims with n in flight and returns each
// prepare's latency.
func inFlight(ctx context.Context, dra drapb.DRAPluginClient, claims []*drapb.Claim, n int) ([]time.Duration, error) {
	lat := make([][]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			for i := k; i < len(claims); i += n {
				d, err := cycle(ctx, dra, claims[i])
				if err != nil {
					errs[k] = err
					return
				}
				lat[k] = append(lat[k], d)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return slices.Concat(lat...), nil
}

func p50ms(l []time.Duration) float64 { return pms(l, 0.5) }

// pms is the q-quantile of l in milliseconds.
func pms(l []time.Duration, q float64) float64 {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))].Microseconds()) / 1000
}
