# rank-podnet.sh: one rank of TestMultiNode's restricted Job, run as
# sh /scripts/rank-podnet.sh in a pod on its own network (no hostNetwork),
# as a non-root user with every capability dropped. The header says who it
# runs as and what the driver put into the container (its RDMA env, its
# device nodes, its memlock limit); then ib_write_bw and ucx_perftest run
# as server (rank 0) or client (rank 1, retrying while the server is not
# up yet), out of band over TCP to rank 0's pod address, over RDMA on the
# node's RoCE GIDs (shared netns mode: a pod sees the host's GID table).
#
# Configured only from the container's env: the device from RDMA_DEVICES;
# the GID index is the lowest RoCE v2 GID (NCCL_IB_ROCE_VERSION_NUM) of
# NCCL_IB_ADDR_FAMILY in the port's table, what NCCL picks with those
# hints (the driver sets no GID index for a pod on its own network: the
# host's positions need not be the pod's); UCX takes UCX_NET_DEVICES and
# makes its own GID choice. UCX_LOG_LEVEL=info only makes UCX name the
# transports it used.
#
# What cannot work in this mode: RDMA-CM clients (rping, ib_write_bw -R,
# UCX's rdmacm wireup). RDMA-CM binds to the pod's own address, and no GID
# holds it (the GIDs carry the host's addresses), so it finds no RDMA
# device for the pod's interface. ib_write_bw without -R exchanges QP
# numbers and GIDs over its own TCP connection, which the pod network
# carries.
#
# Environment: PEER (rank 0's pod address), BW_SIZE BW_ITERS UCX_SIZE
# UCX_ITERS.
. "${0%/*}/watchdog.sh"
log=/dev/termination-log
# What the termination message says goes to the log too, with each tool's
# last lines (the node prints its pods' logs when the test fails).
say() { echo "$*" | tee -a $log; }
now() { cut -d' ' -f1 /proc/uptime; }
# No hw_counters in a pod's view of the device (the kernel gives the
# device's copy in another namespace none).
counters() { printf 'no counters in the pod'; }
dev=$RDMA_DEVICES; rank=$JOB_COMPLETION_INDEX
port=/sys/class/infiniband/$dev/ports/1
status() { awk -v k="$1:" '$1 == k { print $2 }' /proc/self/status; }

# The GID: the lowest index whose type is RoCE v<NCCL_IB_ROCE_VERSION_NUM>
# and whose address is of NCCL_IB_ADDR_FAMILY (IPv4: ::ffff:a.b.c.d; IPv6:
# any other but link-local).
gid=
for i in $(seq 0 255); do
  g=$(cat "$port/gids/$i" 2>/dev/null) || break
  [ "$(cat "$port/gid_attrs/types/$i" 2>/dev/null)" = "RoCE v$NCCL_IB_ROCE_VERSION_NUM" ] || continue
  case $NCCL_IB_ADDR_FAMILY:$g in
  AF_INET:0000:0000:0000:0000:0000:ffff:*) gid=$i; break ;;
  AF_INET6:0000:0000:0000:0000:0000:ffff:* | AF_INET6:fe80:*) ;;
  AF_INET6:*) gid=$i; break ;;
  esac
done
say "rank=$rank uid=$(status Uid) gid=$(status Gid) capeff=$(status CapEff) capbnd=$(status CapBnd) nnp=$(status NoNewPrivs) memlock=$(awk '/^Max locked memory/ { print $4 "/" $5 }' /proc/self/limits)"
say "env: dev=$dev hca=$NCCL_IB_HCA family=$NCCL_IB_ADDR_FAMILY roce=$NCCL_IB_ROCE_VERSION_NUM ncclgid=$NCCL_IB_GID_INDEX ucxgid=$UCX_IB_GID_INDEX ucxdev=$UCX_NET_DEVICES gidx=$gid gidaddr=$(cat "$port/gids/$gid" 2>/dev/null)"
say "devices: $(ls /dev/infiniband | tr '\n' ' ')shm: $(awk '$2 == "/dev/shm" { print $1 }' /proc/mounts)"

# run NAME CMD...: CMD under a 150 s deadline (a transfer takes seconds),
# output in /tmp/NAME.out; rank 1 retries for a minute while rank 0's
# server does not answer yet. RESULT matches the line with the numbers.
run() {
  name=$1; shift; out=/tmp/$name.out
  for i in $(seq 60); do
    t0=$(now); deadline 150 "$@"; rc=$?; t1=$(now)
    tail -n 5 "$out" | sed "s/^/$name try $i: /"
    [ $rc = 0 ] || [ "$rank" = 0 ] || ! grep -qiE 'refused|couldn.t connect|unable to init|no route' "$out" || { sleep 1; continue; }
    break
  done
  say "$name exit=$rc secs=$(echo "$t0" "$t1" | awk '{printf "%.2f", $2-$1}')"
  grep -E "$RESULT" "$out" | tail -n 1 | sed "s/^/$name| /" >> $log
  [ $rc = 0 ] || { grep -iE 'hung|error|fail|fatal|unable|cannot|invalid|refused|timeout' "$out" | grep -vE '\.so|\+0x' | head -n 3; tail -n 1 "$out"; } | uniq | cut -c1-160 | sed "s/^/$name! /" >> $log
}

peer=; [ "$rank" = 0 ] || peer=$PEER
RESULT='^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+'
run ib_write_bw ib_write_bw -F -u 18 -d "$dev" -x "$gid" -p 18515 -s "$BW_SIZE" -n "$BW_ITERS" $peer
# UCX_UD_ETH_DGID_CHECK=n: UCX 1.13's UD drops every packet rxe delivers
# while it checks their destination GID (rank.sh says more).
RESULT='Final:'
if [ "$rank" = 0 ]; then run ucx_perftest env UCX_UD_ETH_DGID_CHECK=n UCX_LOG_LEVEL=info ucx_perftest -p 18518
else run ucx_perftest env UCX_UD_ETH_DGID_CHECK=n UCX_LOG_LEVEL=info ucx_perftest "$PEER" -p 18518 -t tag_bw -s "$UCX_SIZE" -n "$UCX_ITERS"; fi
say "ucx_perftest transports: $(grep -oE '[a-z]+_(verbs|mlx5|tcp)/[A-Za-z0-9_]+:[0-9]+|tcp/[A-Za-z0-9_]+|rdmacm' /tmp/ucx_perftest.out | sort -u | tr '\n' ' ')"
