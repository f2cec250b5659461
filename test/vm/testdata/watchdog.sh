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
#                   killed and $out gets "hung Ss: <counters>" and describe's lines

counters() {
  for f in "$port"/hw_counters/*; do v=$(cat "$f"); [ "$v" = 0 ] || printf '%s=%s ' "${f##*/}" "$v"; done
  [ -z "$nic" ] || awk -v n="$nic:" '$1 == n { printf "rx_drop=%s tx_drop=%s", $5, $13 }' /proc/net/dev
}

describe() { :; }

deadline() {
  limit=$(($1*10)); shift
  "$@" > "$out" 2>&1 & pid=$!; n=0
  while kill -0 $pid 2>/dev/null; do
    n=$((n+1)); [ $n = $limit ] && { echo "hung $((limit/10))s: $(counters)"; describe; } >> "$out" && kill -9 $pid
    sleep 0.1
  done; wait $pid
}
