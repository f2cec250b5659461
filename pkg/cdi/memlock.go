package cdi

import (
	"path/filepath"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// MemlockHookTimeout bounds the memlock hook, in seconds: two prlimit calls.
const MemlockHookTimeout = 10

// MemlockUnlimited is the memlock a container gets unless its class says
// otherwise: the pod's memory cgroup still bounds what it can pin.
const MemlockUnlimited = "unlimited"

// MemlockHook is the OCI createRuntime hook that sets the container
// process's RLIMIT_MEMLOCK (rdma-dra-hook memlock), so it registers memory
// regions without CAP_IPC_LOCK. bytes is a count or MemlockUnlimited; ibdevs
// are named in its refusal.
func MemlockHook(hookPath string, ibdevs []string, bytes string) *cdispec.Hook {
	args := []string{filepath.Base(hookPath), "memlock"}
	for _, d := range ibdevs {
		args = append(args, "--device="+d)
	}
	args = append(args, "--bytes="+bytes)
	timeout := MemlockHookTimeout
	return &cdispec.Hook{HookName: "createRuntime", Path: hookPath, Args: args, Timeout: &timeout}
}
