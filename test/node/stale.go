package node

// Leftovers of a test process that died without running its cleanups
// (SIGKILL, a timeout's panic): its kubelet and containerd die with it
// (parent-death signal), and with them the namespaces, but the shims
// (daemons, reparented) and the containers (in the node's cgroups) live on.
// The next Start ends them.

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

const (
	cgroupPrefix = "rdma-node-" // + owner pid + "-" + sequence
	ownerEnv     = "RDMA_NODE_OWNER"
)

var nodeSeq atomic.Int64

// alive reports whether pid is a running process.
func alive(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) != syscall.ESRCH
}

// sweepStale kills processes of nodes whose owner has died (by the owner
// pid in their environment or cgroup name) and removes those cgroups.
func sweepStale(logf func(string, ...any)) {
	var stale []*Node
	dirs, _ := cgroupMounts()
	seen := map[string]bool{}
	for _, d := range dirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			name := e.Name()
			if !e.IsDir() || !strings.HasPrefix(name, cgroupPrefix) || seen[name] {
				continue
			}
			owner, _, _ := strings.Cut(strings.TrimPrefix(name, cgroupPrefix), "-")
			if pid, err := strconv.Atoi(owner); err == nil && !alive(pid) {
				seen[name] = true
				stale = append(stale, &Node{cgroupRoot: "/" + name})
			}
		}
	}
	killed := 0
	for _, pid := range staleOwned() {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	for _, n := range stale {
		for pid := range n.cgroupPids() {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
	}
	var left []string
	for _, n := range stale {
		if err := n.removeCgroups(); err != nil {
			left = append(left, err.Error())
		}
	}
	if killed > 0 || len(stale) > 0 {
		logf("node: removed leftovers of dead test processes: %d processes, %d cgroup roots%s", killed, len(stale), strings.Join(left, "; "))
	}
}

// staleOwned are processes carrying ownerEnv of a dead owner (shims).
func staleOwned() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	key := []byte(ownerEnv + "=")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, key); ok {
				if owner, err := strconv.Atoi(string(v)); err == nil && owner != os.Getpid() && !alive(owner) {
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}
