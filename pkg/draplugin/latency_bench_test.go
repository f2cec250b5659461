package draplugin

import (
	"context"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// taintWatcher is a publisher that reports whether each publish carries a
// taint.
type taintWatcher chan bool

func (w taintWatcher) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	tainted := false
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			tainted = tainted || slices.ContainsFunc(s.Devices, func(d resourceapi.Device) bool { return len(d.Taints) > 0 })
		}
	}
	w <- tainted
	return nil
}

// changeLatency collects how long each change took to be published.
type changeLatency struct {
	total, worst time.Duration
	n            int
}

func (l *changeLatency) add(since time.Time) {
	el := time.Since(since)
	l.total += el
	l.worst = max(l.worst, el)
	l.n++
}

func (l *changeLatency) report(b *testing.B) {
	if l.n == 0 {
		return
	}
	b.ReportMetric(float64(l.total.Milliseconds())/float64(l.n), "ms/change")
	b.ReportMetric(float64(l.worst.Milliseconds()), "worst-ms")
}

// BenchmarkPortChangeToPublish measures how long a port going DOWN (and
// back) takes to reach the published ResourceSlice with the daemon's
// default 250 ms port watcher: the bound is 1 s.
func BenchmarkPortChangeToPublish(b *testing.B) {
	d, node := newTestDriverOn(b, 250*time.Millisecond, nil, nil)
	w := make(taintWatcher, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := d.SetPublisher(ctx, w); err != nil {
		b.Fatal(err)
	}
	<-w
	go d.Run(ctx)
	var lat changeLatency
	for b.Loop() {
		for _, down := range []bool{true, false} {
			state, phys := "4: ACTIVE", "5: LinkUp"
			if down {
				state, phys = "1: DOWN", "2: Polling"
			}
			start := time.Now()
			if err := node.SetPortState("rxe0", 1, state, phys); err != nil {
				b.Fatal(err)
			}
			for tainted := range w {
				if tainted == down {
					break
				}
			}
			lat.add(start)
		}
	}
	lat.report(b)
}
