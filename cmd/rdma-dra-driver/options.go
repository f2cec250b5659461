package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	configapi "github.com/rdma-dra/rdma-dra-driver/api/rdma.dra.dev/v1alpha1"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/legacy"
)

type options struct {
	nodeName            string
	kubeconfig          string
	driverName          string
	sysfsRoot           string
	devRoot             string
	hostDevRoot         string
	cdiRoot             string
	kubeletRootDir      string
	stateDir            string
	allowNonHostNetwork bool
	rescanInterval      time.Duration
	metricsAddress      string
	healthzAddress      string
	kubeAPIQPS          float32
	kubeAPIBurst        int
	podUID              string
	bootIDFile          string
	sharing             sharingMode
	sharesPerHCA        int64
	legacyRoute         legacyMode
	legacyResourceName  string
	legacyShares        int
	taintUnhealthy      bool
	portPollInterval    time.Duration
	deviceMetadata      bool
	claimStatus         bool
	fullRescanInterval  time.Duration
	hookPath            string
	hookSource          string
	hcaHandlesPerHCA    int64
	hcaObjectsPerHCA    int64
	defaultHCAHandles   int64
	defaultHCAObjects   int64
	claimMaxPercent     int64
	requireHCALimits    bool
	memlock             string
	kernelEvents        bool
	printVersion        bool
	logging             *logsapi.LoggingConfiguration
}

func (o *options) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.nodeName, "node-name", "", "name of this node (required; NODE_NAME)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; in-cluster config when empty")
	fs.StringVar(&o.driverName, "driver-name", "rdma.dra.dev", "DRA driver name, also the attribute domain")
	fs.StringVar(&o.sysfsRoot, "sysfs-root", "/sys", "sysfs to discover HCAs from")
	fs.StringVar(&o.devRoot, "dev-root", "/dev", "directory holding infiniband/ device nodes, as this process sees it")
	fs.StringVar(&o.hostDevRoot, "host-dev-root", "", "the same directory as the container runtime sees it, for CDI specs (default: --dev-root)")
	fs.StringVar(&o.cdiRoot, "cdi-root", "/var/run/cdi", "directory for per-claim CDI specs")
	fs.StringVar(&o.kubeletRootDir, "kubelet-root-dir", "/var/lib/kubelet", "the kubelet's root; plugins_registry, plugins/<driver> and device-plugins are under it")
	fs.StringVar(&o.stateDir, "state-dir", "", "where the checkpoint lives (default <kubelet-root-dir>/plugins/<driver>); must be on disk, not tmpfs")
	fs.BoolVar(&o.allowNonHostNetwork, "allow-non-host-network", false, "let pods without hostNetwork use RDMA")
	fs.DurationVar(&o.rescanInterval, "rescan-interval", 10*time.Second, "rediscovery period (port state, rate and LIDs; the rest on kernel events)")
	fs.DurationVar(&o.fullRescanInterval, "full-rescan-interval", hca.DefaultFullRescanInterval, "period of a rediscovery that reads everything again, for changes no kernel event announces (0: every rescan)")
	fs.StringVar(&o.metricsAddress, "metrics-address", ":9464", "address of the /metrics endpoint; empty disables it")
	fs.StringVar(&o.healthzAddress, "healthz-address", ":9465", "address of /healthz and /readyz; empty disables them")
	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", 50, "API server queries per second of the kubelet's path (the claim GET of every prepare, pods the informer has not seen); background writes have their own budget")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 300, "API server burst of the kubelet's path: the prepares of a node filling up at once")
	fs.StringVar(&o.podUID, "pod-uid", "", "this daemon's pod UID (POD_UID); enables the helper's rolling-update mode")
	fs.StringVar(&o.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "file holding the boot ID")
	fs.StringVar((*string)(&o.sharing), "sharing", string(sharingExclusive), "exclusive: one claim per HCA; shared: many claims share an HCA (shares capacity)")
	fs.Int64Var(&o.sharesPerHCA, "shares-per-hca", 1000, "shares capacity of each HCA in shared mode; a claim consumes 1 unless it asks for more")
	fs.StringVar((*string)(&o.legacyRoute), "legacy", string(legacyOff), "serve rdma/hca for old manifests: off, device-plugin (kubelet device-plugin API) or dra (a DeviceClass with extendedResourceName)")
	fs.StringVar(&o.legacyResourceName, "legacy-resource-name", legacy.DefaultResourceName, "extended resource name of the device-plugin route")
	fs.IntVar(&o.legacyShares, "legacy-shares", legacy.DefaultShares, "how many rdma/hca pods a node takes")
	fs.BoolVar(&o.taintUnhealthy, "taint-unhealthy", true, "taint HCAs whose port is not ACTIVE with rdma.dra.dev/port-down:NoSchedule")
	fs.DurationVar(&o.portPollInterval, "port-poll-interval", 250*time.Millisecond, "how often port state files are checked between rescans; 0 disables")
	fs.StringVar(&o.hookPath, "hook-path", "/opt/rdma-dra-driver/bin/rdma-dra-hook", "host path of the rdma-dra-hook binary (installed by the chart) that CDI specs name to set a container's rdma.max and, in exclusive RDMA netns mode, to move a pod's HCAs into its network namespace")
	fs.StringVar(&o.hookSource, "hook-source", "", "this image's copy of the rdma-dra-hook binary the chart installs; when set, CDI specs name its pinned copy beside --hook-path (see internal/hookbin), so a spec written before an upgrade or rollback runs the hook it was written for")
	fs.Int64Var(&o.hcaHandlesPerHCA, "hca-handles-per-hca", 1000, "shared mode: hcaHandles capacity of each HCA (rdma.max hca_handle a claim may ask for); 0 publishes none")
	fs.Int64Var(&o.hcaObjectsPerHCA, "hca-objects-per-hca", 1000000, "shared mode: hcaObjects capacity of each HCA (rdma.max hca_object a claim may ask for); 0 publishes none")
	fs.Int64Var(&o.defaultHCAHandles, "default-hca-handles", 0, "shared mode, where the hcaHandles capacity is published: the rdma.max hca_handle of a claim that asks for none (and of every legacy rdma/hca container); 0: unlimited")
	fs.Int64Var(&o.defaultHCAObjects, "default-hca-objects", 0, "shared mode, where the hcaObjects capacity is published: the rdma.max hca_object of a claim that asks for none (and of every legacy rdma/hca container); 0: unlimited")
	fs.Int64Var(&o.claimMaxPercent, "claim-max-percent", 100, "shared mode, where the capacities are published: the most of an HCA's hcaHandles and hcaObjects one claim may ask for, in percent (1..100), published as the capacities' request policy maximum so the scheduler refuses more")
	fs.BoolVar(&o.requireHCALimits, "require-hca-limits", false, "shared mode, where the capacities are published: refuse a claim that asks for no hcaHandles or hcaObjects and gets no default")
	fs.StringVar(&o.memlock, "memlock", configapi.MemlockUnlimited, "RLIMIT_MEMLOCK the hook gives every container that gets an HCA, so it pins memory without CAP_IPC_LOCK: unlimited, a quantity (256Mi), or off for no memlock hook (the container keeps the runtime's limit and needs IPC_LOCK); a DeviceClass's config may set its own")
	fs.BoolVar(&o.claimStatus, "claim-status", true, "write each prepared claim's status.devices (its HCA's netdev, addresses, MAC and port), removed on unprepare")
	fs.BoolVar(&o.deviceMetadata, "device-metadata", true, "write each prepared device's metadata file (KEP-5304), bind-mounted into containers under /var/run/kubernetes.io/dra-device-attributes")
	fs.BoolVar(&o.printVersion, "version", false, "print the version, commit and Go version, and exit")
	fs.BoolVar(&o.kernelEvents, "kernel-events", true, "rescan on netlink link messages and uevents (HCAs added or removed; netdev renames when on the host network)")
}

// memlockOff is --memlock's value for no memlock hook.
const memlockOff = "off"

// memlockValue is --memlock as the hook takes it ("unlimited" or a byte
// count), or "" for off (also when unset, as in tests' literal options).
func (o *options) memlockValue() (string, error) {
	if o.memlock == "" || o.memlock == memlockOff {
		return "", nil
	}
	m, err := configapi.ParseMemlock(o.memlock)
	if err != nil {
		return "", fmt.Errorf("--memlock: %w, or %q", err, memlockOff)
	}
	return m.String(), nil
}

// runtimeDevRoot is the dev root CDI specs name: the container runtime's
// view, which differs from ours where the node's /dev is mounted elsewhere
// in the daemon's container (the chart: /host-dev).
func (o *options) runtimeDevRoot() string {
	if o.hostDevRoot != "" {
		return o.hostDevRoot
	}
	return o.devRoot
}

// flagEnv names the only flags read from the environment, with their
// variables: the values a DaemonSet can only pass that way (the downward
// API's node name and pod UID) and the client convention KUBECONFIG.
// Everything else is a flag on the command line, so that a stray variable
// in the environment (SHARING, DEBUG, VERSION) never changes the daemon.
var flagEnv = map[string]string{
	"node-name":  "NODE_NAME",
	"pod-uid":    "POD_UID",
	"kubeconfig": "KUBECONFIG",
}

// envOverrides sets each flag of flagEnv not given on the command line from
// its environment variable; an empty variable counts as unset.
func envOverrides(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(flagEnv)) {
		f := fs.Lookup(name)
		if f == nil || f.Changed {
			continue
		}
		env := flagEnv[name]
		if v, ok := lookup(env); ok && v != "" {
			if err := fs.Set(name, v); err != nil {
				errs = append(errs, fmt.Errorf("environment variable %s: %w", env, err))
			}
		}
	}
	return errors.Join(errs...)
}

// applyEnvironment applies flagEnv from the process's environment.
func applyEnvironment(fs *pflag.FlagSet) error {
	return envOverrides(fs, os.LookupEnv)
}

// applyLogging configures klog from the logging flags.
func applyLogging(o *options) error {
	gate := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(gate); err != nil {
		return err
	}
	return logsapi.ValidateAndApply(o.logging, gate)
}
