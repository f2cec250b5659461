# pingpong-pod.sh PORT [SERVER]: ibv_rc_pingpong on rxe0 with the GID index
# the driver put into the environment, as server (no SERVER) or as client
# once the server listens on PORT at SERVER (the same host network). The
# termination message has the devices seen, whether unclaimed rxe1 opens,
# and the pingpong's output and exit status.
port=$1 server=$2
{
  echo "NCCL_IB_GID_INDEX=$NCCL_IB_GID_INDEX devices: $(ls /dev/infiniband | tr '\n' ' ')"
  o=$(ibv_devinfo -d rxe1 2>&1); echo "rxe1 (not claimed): exit $? $(echo "$o" | tail -n 1)"
  if [ -n "$server" ]; then
    listening=$(printf ':%04X 00000000:0000 0A' "$port")
    for i in $(seq 600); do grep -q "$listening" /proc/net/tcp && break; sleep 0.1; done
  fi
  # shellcheck disable=SC2086 # no SERVER: no argument
  ibv_rc_pingpong -d rxe0 -g "$NCCL_IB_GID_INDEX" -p "$port" -n 500 -s 4096 $server 2>&1; echo "pingpong exit $?"
} > /dev/termination-log
