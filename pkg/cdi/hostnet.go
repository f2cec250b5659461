package cdi

import (
	"path/filepath"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// HostNetworkHookTimeout bounds the host-network check, in seconds: it
// compares two namespace inodes.
const HostNetworkHookTimeout = 10

// HostNetworkHook is the OCI createRuntime hook that refuses a container
// outside the node's network namespace (rdma-dra-hook hostnet), naming
// ibdevs, the HCAs it would get. Where non-hostNetwork RDMA is off, every
// device handed out carries it, first among its hooks, so no route to an
// HCA skips the check.
func HostNetworkHook(hookPath string, ibdevs []string) *cdispec.Hook {
	args := []string{filepath.Base(hookPath), "hostnet"}
	for _, d := range ibdevs {
		args = append(args, "--device="+d)
	}
	timeout := HostNetworkHookTimeout
	return &cdispec.Hook{HookName: "createRuntime", Path: hookPath, Args: args, Timeout: &timeout}
}
