# holder.sh SHARED NODE_IP SVC_IP [SRC DST]...: the holder of a node's
# namespaces, run by unshare. It bind-mounts each SRC on DST, addresses
# lo (SHARED=1: only with the kubernetes Service's IP, the node's IP being
# already the namespace's), says ready and holds the namespaces until its
# stdin closes.
set -e
shared=$1 node_ip=$2 svc_ip=$3
shift 3
while [ $# -ge 2 ]; do
  mount --bind "$1" "$2"
  shift 2
done
if [ "$shared" = 1 ]; then
  ip addr add "$svc_ip/32" dev lo
else
  ip link set lo up
  ip addr add "$node_ip/32" dev lo
  ip addr add "$svc_ip/32" dev lo
fi
echo ready
exec cat >/dev/null
