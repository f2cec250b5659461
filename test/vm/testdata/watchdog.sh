# watchdog.sh: the guests' shell watchdog, sourced by link.sh
# (TestLinkBetweenGuests) and rank.sh (TestMultiNode's ranks): a stalled
# rxe transfer (docs/vm.md) must fail in minutes and say where it stood,
# not hang until the test's timeout. The sourcing script sets port (the rxe
# port's sysfs directory) and out (where a tool's output goes); it may set
# nic (then counters adds the NIC's drops) and redefine describe (more to
# say of a hang).
#
#   counters        the port's non-zero hardware counters, one line, no newline
#   deadline S CMD  CMD with its output in $out; alive after S seconds, it is
#                   killed and $out gets "hung Ss: <counters>" and describe's lines.
#                   If the sourcing script sets stall (seconds), CMD is hung
#                   sooner once the port's packets moved and then stood still
#                   for that long ("hung Ss, no packet for Ts: ...").
#                   If the sourcing script redefines enough (true once CMD
#                   has done its part, setting why), CMD is ended then
#                   ("ended Ss: <why>").

counters() {
  for f in "$port"/hw_counters/*; do v=$(cat "$f"); [ "$v" = 0 ] || printf '%s=%s ' "${f##*/}" "$v"; done
  [ -z "$nic" ] || awk -v n="$nic:" '$1 == n { printf "rx_drop=%s tx_drop=%s", $5, $13 }' /proc/net/dev
}

describe() { :; }

# enough: true once CMD need not run on; it sets why. It runs in this
# shell (not a subshell), so it may keep state between calls.
enough() { false; }

# packets: the port's packets sent and received so far.
packets() { echo $(($(cat "$port/hw_counters/sent_pkts") + $(cat "$port/hw_counters/rcvd_pkts"))); }

deadline() {
  limit=$(($1*10)); shift
  "$@" > "$out" 2>&1 & pid=$!; n=0
  last=$(packets); moved=; still=0; ended=
  while kill -0 $pid 2>/dev/null; do
    if [ -z "$ended" ] && [ $((n % 5)) = 0 ] && enough; then
      ended=1; echo "ended $((n/10))s: $why" >> "$out"; kill $pid
    fi
    n=$((n+1)); [ $n = $limit ] && { echo "hung $((limit/10))s: $(counters)"; describe; } >> "$out" && kill -9 $pid
    if [ -n "$stall" ] && [ $((n % 10)) = 0 ]; then
      p=$(packets); if [ "$p" != "$last" ]; then moved=1; still=0; last=$p; else still=$((still+1)); fi
      [ -n "$moved" ] && [ $still = "$stall" ] && { echo "hung $((n/10))s, no packet for ${stall}s: $(counters)"; describe; } >> "$out" && kill -9 $pid
    fi
    sleep 0.1
  done; wait $pid
}
