# link-up.sh NETDEV: bring NETDEV up; the termination message says ip's exit status.
ip link set "$1" up; echo "ip link set $1 up: exit $?" > /dev/termination-log
