package main

import (
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
	"github.com/rdma-dra/rdma-dra-driver/pkg/legacy"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmacg"
)

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// legacyNetwork is the network of device-plugin pods: the plugin is not told
// which pod it serves, so only the hostNetwork policy says whose GID table
// applies.
func legacyNetwork(allowNonHostNetwork bool) cdi.Network {
	if allowNonHostNetwork {
		return cdi.NetworkUnknown
	}
	return cdi.NetworkHost
}

// legacyHooks are the container-start hooks of the device plugin's node-wide
// device: the hostNetwork check, the memlock (--memlock) and the default limits where the node
// publishes the capacities (rdma/hca pods cannot ask for any).
func legacyHooks(o *options, dcfg draplugin.Config) legacy.Hooks {
	if !filepath.IsAbs(o.hookPath) {
		return legacy.Hooks{}
	}
	h := legacy.Hooks{HookPath: o.hookPath, HostNetworkOnly: !o.allowNonHostNetwork}
	h.Memlock, _ = o.memlockValue() // validatePolicy refused a bad value
	if dcfg.Limits.Handles > 0 {
		h.HCAHandles = min(o.defaultHCAHandles, devices.ClaimCeiling(dcfg.Limits.Handles, o.claimMaxPercent))
	}
	if dcfg.Limits.Objects > 0 {
		h.HCAObjects = min(o.defaultHCAObjects, devices.ClaimCeiling(dcfg.Limits.Objects, o.claimMaxPercent))
	}
	return h
}

// rdmaLimits decides whether shared HCAs publish the RDMA cgroup
// capacities: only where the kernel can enforce them, saying why not.
func rdmaLimits(logger klog.Logger, o *options) (handles, objects int64, hook string) {
	if o.hcaHandlesPerHCA == 0 && o.hcaObjectsPerHCA == 0 {
		return 0, 0, ""
	}
	if ok, why := (rdmacg.FS{Root: "/"}).Available(); !ok {
		logger.Info("Not publishing the hcaHandles and hcaObjects capacities: per-claim RDMA limits cannot be enforced here", "reason", why)
		return 0, 0, ""
	}
	if !filepath.IsAbs(o.hookPath) {
		logger.Info("Not publishing the hcaHandles and hcaObjects capacities: --hook-path is not an absolute path", "hookPath", o.hookPath)
		return 0, 0, ""
	}
	return o.hcaHandlesPerHCA, o.hcaObjectsPerHCA, o.hookPath
}

// driverConfig maps the options to the driver's configuration.
func driverConfig(logger klog.Logger, o *options, pluginDir string) draplugin.Config {
	dcfg := draplugin.Config{
		DriverName:          o.driverName,
		NodeName:            o.nodeName,
		HostDevRoot:         o.runtimeDevRoot(),
		AllowNonHostNetwork: o.allowNonHostNetwork,
		RescanInterval:      o.rescanInterval,
		TaintUnhealthy:      o.taintUnhealthy,
		PortPollInterval:    o.portPollInterval,
		DeviceMetadata:      o.deviceMetadata,
		PluginDataDir:       pluginDir,
	}
	if o.sharing == sharingShared {
		dcfg.Shares = o.sharesPerHCA
		dcfg.Limits.Handles, dcfg.Limits.Objects, dcfg.HookPath = rdmaLimits(logger, o)
		dcfg.Limits.DefaultHandles, dcfg.Limits.DefaultObjects, dcfg.Limits.Require = o.defaultHCAHandles, o.defaultHCAObjects, o.requireHCALimits
		dcfg.Limits.ClaimMaxPercent = o.claimMaxPercent
	}
	if filepath.IsAbs(o.hookPath) {
		// Also for moving HCAs into pods' network namespaces (exclusive
		// RDMA netns mode), which the driver decides per claim.
		dcfg.HookPath = o.hookPath
		dcfg.Memlock, _ = o.memlockValue() // validatePolicy refused a bad value
	}
	if o.legacyRoute == legacyDRA {
		dcfg.LegacyShares = int64(o.legacyShares)
	}
	return dcfg
}
