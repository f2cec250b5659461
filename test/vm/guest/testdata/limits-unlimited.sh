# limits-unlimited.sh PINGPONG_ARGS PORT UVERBS: in a container whose claim
# has no limits: an ibv_rc_pingpong server (PINGPONG_ARGS, listening on
# PORT), a second open by ibv_devinfo, three more verbs contexts on UVERBS
# and the pingpong's client all succeed.
echo "rdma.max: $(cat /sys/fs/cgroup/rdma.max)"
# shellcheck disable=SC2086 # PINGPONG_ARGS are words
ibv_rc_pingpong $1 > /tmp/server.log 2>&1 &
s=$!
listening=$(printf ':%04X 00000000:0000 0A' "$2")
for i in $(seq 300); do grep -q "$listening" /proc/net/tcp && break; sleep 0.1; done
o=$(ibv_devinfo -d rxe0 2>&1); e=$?; echo "second open (ibv_devinfo -d rxe0): exit $e $(echo "$o" | grep -m1 state:)"
RDMA_DRA_VM_HELPER=uverbs-contexts UVERBS=$3 N=3 /guest/guest.test
# shellcheck disable=SC2086
ibv_rc_pingpong $1 10.0.2.15; c=$?
wait $s; r=$?; cat /tmp/server.log; echo client=$c server=$r; [ $c = 0 ] && [ $r = 0 ]
