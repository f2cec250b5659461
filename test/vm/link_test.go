package vm

// TestLinkBetweenGuests: the two-node test's link alone, no node: two
// guests on QEMU's socket netdev, an rxe on each end, and rdma-core's
// ibv_rc_pingpong and rping between the two kernels. It is what rxe0 <->
// rxe1 inside one kernel cannot do (docs/vm.md), in a minute or two. A
// tool that hangs is described and killed after 90 s; a stalled pingpong
// (the 6.1 rxe requester, docs/vm.md) runs once more.

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestLinkBetweenGuests(t *testing.T) {
	cache := requireVM(t)
	cacheDir := cache.Dir
	ctx := context.Background()
	dir := t.TempDir()
	files, err := scriptFiles(dir, "link.sh", "watchdog.sh")
	if err != nil {
		t.Fatal(err)
	}
	im, err := cache.Build(ctx, dir, ImageSpec{Files: files, Prog: "/bin/sh", Args: []string{guestScripts + "/link.sh"}})
	if err != nil {
		t.Fatalf("building the VM image: %v", err)
	}
	accel := chooseAccel(ctx, t, cacheDir, im)
	ports := freeUDPPorts(t, 2)
	results := make([]*Result, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := time.Now()
	for i, n := range linkNodes {
		wg.Add(1)
		b := &Boot{Image: im, Dir: t.TempDir(), Accel: accel, Timeout: 8 * time.Minute,
			Link:   &LinkNIC{MAC: n.mac, Local: ports[i], Remote: ports[1-i]},
			Append: []string{fmt.Sprintf("RANK=%d", i)}}
		go func() { defer wg.Done(); results[i], errs[i] = b.Run(ctx) }()
	}
	wg.Wait()
	pingpong := regexp.MustCompile(`(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec`)
	for i, n := range linkNodes {
		if errs[i] != nil {
			t.Errorf("%s: %v", n.name, errs[i])
			continue
		}
		out := strings.Join(results[i].Output, "\n")
		t.Logf("%s (rank %d) said:\n%s", n.name, i, out)
		for _, w := range []string{"pingpong exit 0", "rping exit 0", "rxe2 on "} {
			if !strings.Contains(out, w) {
				t.Errorf("%s: no %q in its output", n.name, w)
			}
		}
		if m := pingpong.FindStringSubmatch(out); m == nil {
			t.Errorf("%s: no ibv_rc_pingpong transfer reported", n.name)
		} else if i == 1 {
			note := ""
			if strings.Contains(out, "stalled:") {
				note = " (second run: the first stalled, see the log)"
			}
			fmt.Printf("cross-guest: ibv_rc_pingpong %s bytes %s/rxe2 <-> %s/rxe2 in %ss (%s Mbit/s)%s\n", m[1], linkNodes[0].name, linkNodes[1].name, m[2], m[3], note)
		}
	}
	t.Logf("two guests, boot to power-off: %v", time.Since(start).Round(time.Second))
}
