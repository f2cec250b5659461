# link.sh: TestLinkBetweenGuests' guest program, run in both guests as
# sh /scripts/link.sh with RANK (0 or 1) from the kernel command line.
# Rank 0 serves, rank 1 connects, retrying until rank 0 is up. A tool that
# hangs is described and killed after 90 s, or once its packets stood
# still for 20 s (watchdog.sh): a healthy transfer moves some every few ms.
. "${0%/*}/watchdog.sh"
stall=20
out=/tmp/out
mac=52:54:00:00:09:0$((RANK+1)); me=10.0.9.$((RANK+1)); peer=10.0.9.$((2-RANK))
for d in /sys/class/net/*; do [ "$(cat "$d/address")" = "$mac" ] && nic=${d##*/}; done
[ -n "$nic" ] || { echo "no NIC with $mac"; exit 1; }
ip addr add "$me/24" dev "$nic" && ip link set "$nic" up && rdma link add rxe2 type rxe netdev "$nic" || exit 1
want=$(printf '0000:0000:0000:0000:0000:ffff:0a00:09%02x' $((RANK+1)))
port=/sys/class/infiniband/rxe2/ports/1
for i in $(seq 100); do
  gid=; for g in $(seq 0 15); do
    [ "$(cat $port/gids/$g)" = "$want" ] && [ "$(cat $port/gid_attrs/types/$g 2>/dev/null)" = "RoCE v2" ] && gid=$g && break
  done
  grep -q ACTIVE $port/state && [ -n "$gid" ] && break; sleep 0.1
done
echo "rank $RANK: rxe2 on $nic ($me), $(cat $port/state), RoCE v2 GID index $gid"

# try CMD...: CMD under a 90 s deadline, then its output and the port's
# counters; rank 1 retries while rank 0's server is not up yet.
try() {
  for i in $(seq 120); do
    deadline 90 "$@"; rc=$?
    [ $rc = 0 ] || [ "$RANK" = 0 ] || grep -q "^hung" $out || { sleep 0.5; continue; }
    break
  done
  cat $out; counters; echo; return $rc
}
describe() { rdma res show qp; dmesg | tail -n 5; }

# pingpong [SERVER]: ibv_rc_pingpong, and once more on the next port if it
# hung. The 6.1 kernel's rxe requester can stall after a retransmit (both
# QPs in RTS, no packet moves); ibv_rc_pingpong's 67 ms ACK timeout, fixed
# in the tool, fires spuriously when TCG deschedules a guest (docs/vm.md).
pingpong() {
  try ibv_rc_pingpong -d rxe2 -g "$gid" -n 200 -s 65536 -p 18515 "$@" && return 0
  rc=$?; grep -q "^hung" $out || return $rc
  echo "stalled: once more on port 18516"
  try ibv_rc_pingpong -d rxe2 -g "$gid" -n 200 -s 65536 -p 18516 "$@"
}

if [ "$RANK" = 0 ]; then
  pingpong; echo "pingpong exit $?"
  try rping -s -a "$me" -C 200 -S 4096; echo "rping exit $?"
else
  pingpong "$peer"; echo "pingpong exit $?"
  try rping -c -a "$peer" -C 200 -S 4096 -V; echo "rping exit $?"
fi
