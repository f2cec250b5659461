# memlock.sh UVERBS DEV GID PORT SIZE [SERVER_IP]: the container of
# TestMemlockWithoutCapabilities. It says who it runs as (its ids,
# capability sets and no_new_privs, from /proc/self/status) and its memlock
# limit (soft, hard), registers a SIZE-byte memory region on UVERBS with the
# guest binary's raw uverbs helper (the kernel's own answer), then runs
# ibv_rc_pingpong on DEV with one SIZE-byte message each way: the server
# without SERVER_IP, else the client of the server there. Exits with
# ibv_rc_pingpong's status.
grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status | tr -s '\t ' '  '
echo "memlock: $(awk '/^Max locked memory/ { print $4, $5 }' /proc/self/limits)"
RDMA_DRA_VM_HELPER=uverbs-reg-mr UVERBS=$1 BYTES=$5 /guest/guest.test 2>&1
# shellcheck disable=SC2086 # an empty SERVER_IP is no argument
ibv_rc_pingpong -d "$2" -g "$3" -p "$4" -s "$5" -n 1 $6 2>&1
