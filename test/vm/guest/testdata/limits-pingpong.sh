# limits-pingpong.sh PINGPONG_ARGS...: the container's rdma.max, then
# ibv_rc_pingpong with the given arguments (a client within its limit, or a
# run the limit stops).
echo "rdma.max: $(cat /sys/fs/cgroup/rdma.max)"
ibv_rc_pingpong "$@"
