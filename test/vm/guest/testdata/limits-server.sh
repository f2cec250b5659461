# limits-server.sh PINGPONG_ARGS PORT UVERBS: in a container whose claim
# allows one verbs context (hca_handle=1): an ibv_rc_pingpong server
# (PINGPONG_ARGS, listening on PORT) holds it while a second open is
# refused, by rdma-core's ibv_devinfo and by the kernel's answer to
# GET_CONTEXT on UVERBS; then /out/second-open-done tells the test to start
# the client. Exits with the server's status.
echo "rdma.max: $(cat /sys/fs/cgroup/rdma.max)"
# shellcheck disable=SC2086 # PINGPONG_ARGS are words
ibv_rc_pingpong $1 > /tmp/server.log 2>&1 &
s=$!
listening=$(printf ':%04X 00000000:0000 0A' "$2")
for i in $(seq 300); do grep -q "$listening" /proc/net/tcp && break; sleep 0.1; done
echo "rdma.current: $(cat /sys/fs/cgroup/rdma.current)"
o=$(ibv_devinfo -d rxe0 2>&1); e=$?; echo "second open (ibv_devinfo -d rxe0): exit $e $(echo "$o" | tail -n 1)"
RDMA_DRA_VM_HELPER=uverbs-contexts UVERBS=$3 N=1 /guest/guest.test
touch /out/second-open-done
wait $s; r=$?; cat /tmp/server.log; echo server=$r; exit $r
