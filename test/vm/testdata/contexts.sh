# contexts.sh GUEST_TEST: the container's rdma.max for rxe0, then two verbs
# contexts asked of the kernel by the guest's test binary (its
# uverbs-contexts helper); the termination message says what happened.
cg=$(cut -d: -f3 /proc/self/cgroup)
{ echo "rdma.max: $(grep rxe0 "/sys/fs/cgroup${cg%/}/rdma.max")"
  RDMA_DRA_VM_HELPER=uverbs-contexts UVERBS=$(ls /dev/infiniband/uverbs*) N=2 "$1" 2>&1
  echo "contexts exit $?"; } > /dev/termination-log
cat /dev/termination-log
