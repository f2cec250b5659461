# rank.sh JOB: one rank of TestMultiNode's Indexed Jobs, run as
# sh /scripts/rank.sh transfers|portdown. The header says what the driver
# put into the container (its env, device nodes, and the metadata file's
# fields the slice no longer has); then each transfer runs as server
# (rank 0) or client (rank 1, retrying while rank 0's server is not up
# yet). The termination message carries a summary: the kubelet keeps
# 4 KiB of it.
#
# Environment: PEER (rank 0's address), MD (the claim's metadata file),
# DRIVER (the driver's name), KEYS (the metadata fields to report,
# separated by |), and the transfers' sizes BW_SIZE BW_ITERS LAT_SIZE
# LAT_ITERS RPING_SIZE RPING_COUNT UCX_SIZE UCX_ITERS.
. "${0%/*}/watchdog.sh"
log=/dev/termination-log
say() { echo "$*" >> $log; }
now() { cut -d' ' -f1 /proc/uptime; }
dev=$RDMA_DEVICES; gid=$NCCL_IB_GID_INDEX; rank=$JOB_COMPLETION_INDEX
pkts() { cat "/sys/class/infiniband/$dev/ports/1/hw_counters/sent_pkts" "/sys/class/infiniband/$dev/ports/1/hw_counters/rcvd_pkts" | tr '\n' ' '; }
say "rank=$rank dev=$dev gid=$gid ucxgid=$UCX_IB_GID_INDEX ucxdev=$UCX_NET_DEVICES uverbs=$(env | grep '^RDMA_DEVICE_' | cut -d= -f2) devices: $(ls /dev/infiniband | tr '\n' ' ')"
# The metadata file's fields as key=value: its JSON without blanks, one
# "DRIVER/key":{"type":value} per match.
[ -r "$MD" ] || say "metadata: no $MD"
drv=$(printf %s "$DRIVER" | sed 's/[.]/\\./g')
field='"'"$drv"'/([A-Za-z0-9]+)":\{"[a-z]+":'
say "md: $(tr -d ' \n' < "$MD" | grep -oE "$field"'[^}]*\}' | sed -E 's|^'"$field"'"?([^"}]*)"?\}$|\1=\2|' | grep -E "^($KEYS)=" | tr '\n' ' ')"

port=/sys/class/infiniband/$dev/ports/1
# run NAME CMD...: CMD under a 300 s deadline (the port-down transfer takes
# about 185 s), output in /tmp/NAME.out; rank 0 serves, rank 1 connects,
# retrying a refused connection. RESULT matches the line with the numbers.
run() {
  name=$1; shift; out=/tmp/$name.out; p0=$(pkts)
  for i in $(seq 180); do
    t0=$(now); deadline 300 "$@"; rc=$?; t1=$(now)
    [ $rc = 0 ] || [ "$rank" = 0 ] || ! grep -qiE 'refused|couldn.t connect|REJECTED|UNREACHABLE|unable to init' "$out" || { sleep 1; continue; }
    break
  done
  say "$name exit=$rc secs=$(echo "$t0" "$t1" | awk '{printf "%.2f", $2-$1}') pkts=$p0-> $(pkts)"
  grep -E "$RESULT" "$out" | tail -n 1 | sed "s/^/$name| /" >> $log
  # A failure's cause, short (the message's 4 KiB are shared by all tools).
  [ $rc = 0 ] || { grep -iE 'hung|error|fail|assert|fatal|unable|cannot|invalid|refused|timeout' "$out" | grep -vE '\.so|\+0x' | head -n 3; tail -n 1 "$out"; } | uniq | cut -c1-160 | sed "s/^/$name! /" >> $log
  [ $rc != 0 ] || grep -qE "$RESULT" "$out" || tail -n 3 "$out" | cut -c1-160 | sed "s/^/$name? /" >> $log
}

# transfers: each tool in the order TestMultiNode reports them. perftest's
# ACK timeout is 1 s (-u 18), not its 67 ms default: under TCG a
# descheduled guest ACKs late, and the 6.1 kernel's rxe requester can
# stall for good after such a spurious retransmit (TestLinkBetweenGuests).
transfers() {
  peer=; [ "$rank" = 0 ] || peer=$PEER
  RESULT='^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+'
  run ib_write_bw ib_write_bw -F -u 18 -d "$dev" -x "$gid" -p 18515 -s "$BW_SIZE" -n "$BW_ITERS" $peer
  RESULT='^ *[0-9]+ +[0-9]+ '
  run ib_read_lat ib_read_lat -F -u 18 -d "$dev" -x "$gid" -p 18516 -s "$LAT_SIZE" -n "$LAT_ITERS" $peer
  RESULT='.^'
  if [ "$rank" = 0 ]; then run rping rping -s -a "$PEER" -p 18517 -C "$RPING_COUNT" -S "$RPING_SIZE"
  else run rping rping -c -a "$PEER" -p 18517 -C "$RPING_COUNT" -S "$RPING_SIZE" -V; fi
  # UCX 1.13's ud_verbs drops every UD packet rxe delivers when it checks
  # their destination GID (its default): the wireup never completes ("UD
  # endpoint ... unhandled timeout error", 3 runs of 3), while with the
  # check off the same run moves its 200 messages. The check is UCX's own
  # filter, not device selection: the device and GID still come only from
  # the driver.
  RESULT='Final:'
  if [ "$rank" = 0 ]; then run ucx_perftest env UCX_UD_ETH_DGID_CHECK=n ucx_perftest -p 18518
  else run ucx_perftest env UCX_UD_ETH_DGID_CHECK=n ucx_perftest "$PEER" -p 18518 -t tag_bw -s "$UCX_SIZE" -n "$UCX_ITERS"; fi
}

# portdown: an ib_write_bw of up to 180 s while the test takes node B's
# link down; on B it ends once the port is back (whether the transfer
# survived the flap varies: waiting out its 180 s only cost time), then
# B says its port's state. A's ends when B's peer is gone, or with the Job.
portdown() {
  peer=; [ "$rank" = 0 ] || peer=$PEER
  RESULT='^ *[0-9]+ +[0-9]+ '
  state=$port/state; went_down=
  enough() {
    if grep -q ACTIVE "$state"; then why="the port went down and is back"; [ -n "$went_down" ]
    else went_down=1; false; fi
  }
  run ib_write_bw ib_write_bw -F -d "$dev" -x "$gid" -p 18519 -s 65536 -D 180 $peer
  for i in $(seq 600); do grep -q ACTIVE "$state" && break; sleep 0.5; done
  say "port after: $(cat "$state")"
}

case $1 in
transfers | portdown) "$1" ;;
*) say "rank.sh: unknown job '$1'"; exit 2 ;;
esac
