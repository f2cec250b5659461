package hca_test

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

// The daemon's defaults (cmd/rdma-dra-driver: --rescan-interval,
// --port-poll-interval).
const (
	defaultRescan   = 10 * time.Second
	defaultPortPoll = 250 * time.Millisecond
)

// BenchmarkRescanCPU is one minute of a quiet node's background work at the
// default settings: a rescan every 10 s (what changes silently re-read; the
// full pass every 5 minutes is left out) and a port state poll every
// 250 ms, with nothing changing (so the poll triggers no discovery). One op
// is that minute's work done back to back; cpu-ms/min is the process's
// user+sys time for it (getrusage), split into discovery and the watcher.
func BenchmarkRescanCPU(b *testing.B) {
	rescans := int(time.Minute / defaultRescan)
	polls := int(time.Minute / defaultPortPoll)
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("hcas=%d", n), func(b *testing.B) {
			node := build(b, hcatest.Synthetic(n))
			d := hca.NewDiscoverer(hca.WithSysfsRoot(node.SysfsRoot), hca.WithDevRoot(node.DevRoot))
			// The daemon's first discovery, at start: a full pass.
			if _, err := d.Discover(); err != nil {
				b.Fatal(err)
			}
			var discover, watch time.Duration
			for b.Loop() {
				t0 := cpuTime(b)
				for range rescans {
					if _, err := d.Discover(); err != nil {
						b.Fatal(err)
					}
				}
				t1 := cpuTime(b)
				for range polls {
					if _, err := d.PortStates(); err != nil {
						b.Fatal(err)
					}
				}
				t2 := cpuTime(b)
				discover += t1 - t0
				watch += t2 - t1
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(b.N) }
			b.ReportMetric(ms(discover+watch), "cpu-ms/min")
			b.ReportMetric(ms(discover), "discover-cpu-ms/min")
			b.ReportMetric(ms(watch), "watcher-cpu-ms/min")
		})
	}
}

// cpuTime is the process's user+sys CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
