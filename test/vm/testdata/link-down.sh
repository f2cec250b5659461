# link-down.sh RXE NETDEV: once RXE has counted 2,000 more packets (a
# minute at most), take NETDEV down; the termination message says the
# packet counts and ip's exit status.
c=/sys/class/infiniband/$1/ports/1/hw_counters
pkts() { echo $(( $(cat "$c/sent_pkts") + $(cat "$c/rcvd_pkts") )); }
base=$(pkts); for i in $(seq 240); do [ "$(pkts)" -gt $((base+2000)) ] && break; sleep 0.25; done
echo "packets $base -> $(pkts)" > /dev/termination-log
ip link set "$2" down; echo "ip link set $2 down: exit $?" >> /dev/termination-log
