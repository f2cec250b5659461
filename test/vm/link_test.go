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

// linkScript runs in both guests; RANK (0 or 1) comes from the kernel
// command line. Rank 0 serves, rank 1 connects, retrying until rank 0 is up.
var linkScript = watchdogSh + `out=/tmp/out
mac=52:54:00:00:09:0$((RANK+1)); me=10.0.9.$((RANK+1)); peer=10.0.9.$((2-RANK))
for d in /sys/class/net/*; do [ "$(cat $d/address)" = $mac ] && nic=${d##*/}; done
[ -n "$nic" ] || { echo "no NIC with $mac"; exit 1; }
ip addr add $me/24 dev $nic && ip link set $nic up && rdma link add rxe2 type rxe netdev $nic || exit 1
want=$(printf '0000:0000:0000:0000:0000:ffff:0a00:09%02x' $((RANK+1)))
port=/sys/class/infiniband/rxe2/ports/1
for i in $(seq 100); do
  gid=; for g in $(seq 0 15); do
    [ "$(cat $port/gids/$g)" = $want ] && [ "$(cat $port/gid_attrs/types/$g 2>/dev/null)" = "RoCE v2" ] && gid=$g && break
  done
  grep -q ACTIVE $port/state && [ -n "$gid" ] && break; sleep 0.1
done
echo "rank $RANK: rxe2 on $nic ($me), $(cat $port/state), RoCE v2 GID index $gid"
# try CMD...: CMD under a 90 s deadline (watchdogSh), then its output and
# the port's counters; rank 1 retries while rank 0's server is not up yet.
try() {
  for i in $(seq 120); do
    deadline 90 "$@"; rc=$?
    [ $rc = 0 ] || [ $RANK = 0 ] || grep -q "^hung" $out || { sleep 0.5; continue; }
    break
  done
  cat $out; echo "$(counters)"; return $rc
}
describe() { rdma res show qp; dmesg | tail -n 5; }
# pingpong: ibv_rc_pingpong, and once more on the next port if it hung.
# The 6.1 kernel's rxe requester can stall after a retransmit (both QPs in
# RTS, no packet moves); ibv_rc_pingpong's 67 ms ACK timeout, fixed in the
# tool, fires spuriously when TCG deschedules a guest (docs/vm.md).
pingpong() {
  try ibv_rc_pingpong -d rxe2 -g $gid -n 200 -s 65536 -p 18515 $server && return 0
  rc=$?; grep -q "^hung" $out || return $rc
  echo "stalled: once more on port 18516"
  try ibv_rc_pingpong -d rxe2 -g $gid -n 200 -s 65536 -p 18516 $server
}
if [ $RANK = 0 ]; then
  server=; pingpong; echo "pingpong exit $?"
  try rping -s -a $me -C 200 -S 4096; echo "rping exit $?"
else
  server=$peer; pingpong; echo "pingpong exit $?"
  try rping -c -a $peer -C 200 -S 4096 -V; echo "rping exit $?"
fi
`

func TestLinkBetweenGuests(t *testing.T) {
	cache := requireVM(t)
	cacheDir := cache.Dir
	ctx := context.Background()
	dir := t.TempDir()
	im, err := cache.Build(ctx, dir, ImageSpec{Prog: "/bin/sh", Args: []string{"-c", linkScript}})
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
