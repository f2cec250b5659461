// Command rdma-dra-driver is the node daemon: it discovers the node's RDMA
// HCAs, publishes them as ResourceSlices and serves the kubelet's DRA gRPC.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/component-base/metrics"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/driver"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/kevents"
	"github.com/rdma-dra/rdma-dra-driver/pkg/legacy"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmacg"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
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
	sharing             string
	sharesPerHCA        int64
	legacyRoute         string
	legacyResourceName  string
	legacyShares        int
	taintUnhealthy      bool
	portPollInterval    time.Duration
	deviceMetadata      bool
	hookPath            string
	hcaHandlesPerHCA    int64
	hcaObjectsPerHCA    int64
	kernelEvents        bool
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
	fs.DurationVar(&o.rescanInterval, "rescan-interval", 10*time.Second, "rediscovery period")
	fs.StringVar(&o.metricsAddress, "metrics-address", ":9464", "address of the /metrics endpoint; empty disables it")
	fs.StringVar(&o.healthzAddress, "healthz-address", ":9465", "address of /healthz and /readyz; empty disables them")
	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", 50, "API server queries per second (the helper GETs every claim it prepares)")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 100, "API server burst")
	fs.StringVar(&o.podUID, "pod-uid", "", "this daemon's pod UID (POD_UID); enables the helper's rolling-update mode")
	fs.StringVar(&o.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "file holding the boot ID")
	fs.StringVar(&o.sharing, "sharing", "exclusive", "exclusive: one claim per HCA; shared: many claims share an HCA (shares capacity)")
	fs.Int64Var(&o.sharesPerHCA, "shares-per-hca", 1000, "shares capacity of each HCA in shared mode; a claim consumes 1 unless it asks for more")
	fs.StringVar(&o.legacyRoute, "legacy", "off", "serve rdma/hca for old manifests: off, device-plugin (kubelet device-plugin API) or dra (a DeviceClass with extendedResourceName)")
	fs.StringVar(&o.legacyResourceName, "legacy-resource-name", legacy.DefaultResourceName, "extended resource name of the device-plugin route")
	fs.IntVar(&o.legacyShares, "legacy-shares", legacy.DefaultShares, "how many rdma/hca pods a node takes")
	fs.BoolVar(&o.taintUnhealthy, "taint-unhealthy", true, "taint HCAs whose port is not ACTIVE with rdma.dra.dev/port-down:NoSchedule")
	fs.DurationVar(&o.portPollInterval, "port-poll-interval", 250*time.Millisecond, "how often port state files are checked between rescans; 0 disables")
	fs.StringVar(&o.hookPath, "hook-path", "/opt/rdma-dra-driver/bin/rdma-dra-hook", "host path of the rdma-dra-hook binary (installed by the chart) that CDI specs name to set a container's rdma.max and, in exclusive RDMA netns mode, to move a pod's HCAs into its network namespace")
	fs.Int64Var(&o.hcaHandlesPerHCA, "hca-handles-per-hca", 1000, "shared mode: hcaHandles capacity of each HCA (rdma.max hca_handle a claim may ask for); 0 publishes none")
	fs.Int64Var(&o.hcaObjectsPerHCA, "hca-objects-per-hca", 1000000, "shared mode: hcaObjects capacity of each HCA (rdma.max hca_object a claim may ask for); 0 publishes none")
	fs.BoolVar(&o.deviceMetadata, "device-metadata", true, "write each prepared device's metadata file (KEP-5304), bind-mounted into containers under /var/run/kubernetes.io/dra-device-attributes")
	fs.BoolVar(&o.kernelEvents, "kernel-events", true, "rescan on netlink link messages and uevents (HCAs added or removed; netdev renames when on the host network)")
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

// validateModes refuses combinations that would break the sharing
// invariant: no claim gets exclusive use of an HCA that is handed out shared.
func validateModes(o *options) error {
	switch o.sharing {
	case "exclusive", "shared":
	default:
		return fmt.Errorf("--sharing=%q: want exclusive or shared", o.sharing)
	}
	if o.sharing == "shared" && o.sharesPerHCA < 1 {
		return fmt.Errorf("--shares-per-hca=%d: want at least 1", o.sharesPerHCA)
	}
	if o.hcaHandlesPerHCA < 0 || o.hcaObjectsPerHCA < 0 {
		return fmt.Errorf("--hca-handles-per-hca=%d, --hca-objects-per-hca=%d: want 0 or more", o.hcaHandlesPerHCA, o.hcaObjectsPerHCA)
	}
	switch o.legacyRoute {
	case legacy.LegacyOff:
		return nil
	case legacy.LegacyDevicePlugin:
		return legacy.ValidateMode(o.legacyRoute, o.sharing)
	case legacy.LegacyDRA:
		if o.sharing != "shared" {
			return errors.New("--legacy=dra publishes one device that hands every HCA to every rdma/hca pod, so it needs --sharing=shared (the HCAs are shared); set --sharing=shared or use --legacy=off")
		}
		if o.legacyShares < 1 {
			return fmt.Errorf("--legacy-shares=%d: want at least 1", o.legacyShares)
		}
		return nil
	}
	return fmt.Errorf("--legacy=%q: want off, device-plugin or dra (one route only: a node must not advertise rdma/hca twice)", o.legacyRoute)
}

// envOverrides lets each flag be set from its environment variable
// (--node-name from NODE_NAME), the way DaemonSets pass values. A flag
// given on the command line wins.
func envOverrides(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		env := strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := lookup(env); ok && v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("environment variable %s: %w", env, err))
			}
		}
	})
	return errors.Join(errs...)
}

func main() {
	o := &options{logging: logsapi.NewLoggingConfiguration()}
	fs := pflag.NewFlagSet("rdma-dra-driver", pflag.ContinueOnError)
	o.addFlags(fs)
	logsapi.AddFlags(o.logging, fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if err := run(o, fs); err != nil {
		klog.Background().Error(err, "rdma-dra-driver failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

func run(o *options, fs *pflag.FlagSet) (err error) {
	own := pflag.NewFlagSet("", pflag.ContinueOnError)
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "v" && !strings.HasPrefix(f.Name, "log") && f.Name != "vmodule" {
			own.AddFlag(f)
		}
	})
	if err := envOverrides(own, os.LookupEnv); err != nil {
		return err
	}
	gate := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(gate); err != nil {
		return err
	}
	if err := logsapi.ValidateAndApply(o.logging, gate); err != nil {
		return err
	}
	defer logs.FlushLogs()
	if o.nodeName == "" {
		return errors.New("--node-name (NODE_NAME) is required")
	}
	if err := validateModes(o); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.Background().WithValues("node", o.nodeName, "driver", o.driverName)
	// A SIGTERM while starting (waiting for an informer, say) is a clean
	// stop, not a failure.
	defer func() {
		if err != nil && ctx.Err() != nil {
			logger.Info("Stopped during start-up", "cause", context.Cause(ctx), "interrupted", err)
			err = nil
		}
	}()
	ctx = klog.NewContext(ctx, logger)

	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = o.kubeAPIQPS, o.kubeAPIBurst
	cfg.UserAgent = "rdma-dra-driver/" + o.nodeName
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}

	pluginDir := filepath.Join(o.kubeletRootDir, "plugins", o.driverName)
	registryDir := filepath.Join(o.kubeletRootDir, "plugins_registry")
	stateDir := o.stateDir
	if stateDir == "" {
		stateDir = pluginDir
	}
	dirs := []string{pluginDir, registryDir, stateDir, o.cdiRoot}
	if o.legacyRoute == legacy.LegacyDevicePlugin {
		dirs = append(dirs, filepath.Join(o.kubeletRootDir, "device-plugins"))
	}
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	bootID, err := checkpoint.BootIDFrom(o.bootIDFile)
	if err != nil {
		return fmt.Errorf("reading the boot ID: %w", err)
	}

	// Pods are looked up for the hostNetwork policy and, where every pod
	// may use RDMA, still for the GID hints (a pod network's GIDs are not
	// at the host's index).
	pods := driver.NewPodInformer(client, o.nodeName)
	if err := pods.Start(ctx); err != nil {
		return err
	}
	m := driver.NewMetrics()
	deps := driver.Deps{
		// RDMA netlink adds the netns mode and soft-iWARP's netdev; only for
		// the host's /sys, never for a simulated tree.
		Inventory: hca.NewDiscoverer(hca.WithSysfsRoot(o.sysfsRoot), hca.WithDevRoot(o.devRoot),
			hca.WithNetlink(hca.HostNetlink(o.sysfsRoot))),
		SpecDir:    cdi.NewSpecDir(o.cdiRoot),
		Checkpoint: checkpoint.NewStore(filepath.Join(stateDir, "checkpoint.json")),
		BootID:     bootID,
		Metrics:    m,
	}
	deps.Pods = pods
	if o.kernelEvents {
		// Optional: without it, changes are still seen by the port watcher
		// and the rescan interval.
		if w, err := kevents.Open(); err != nil {
			logger.Error(err, "Kernel events unavailable; relying on polling", "rescanInterval", o.rescanInterval)
		} else {
			defer w.Close()
			deps.KernelEvents = w.Events()
		}
	}
	dcfg := driver.Config{
		DriverName:          o.driverName,
		NodeName:            o.nodeName,
		HostDevRoot:         o.runtimeDevRoot(),
		AllowNonHostNetwork: o.allowNonHostNetwork,
		RescanInterval:      o.rescanInterval,
		TaintUnhealthy:      o.taintUnhealthy,
		PortPollInterval:    o.portPollInterval,
		DeviceMetadata:      o.deviceMetadata,
	}
	if o.sharing == "shared" {
		dcfg.Shares = o.sharesPerHCA
		dcfg.HCAHandles, dcfg.HCAObjects, dcfg.HookPath = rdmaLimits(logger, o)
	}
	if filepath.IsAbs(o.hookPath) {
		// Also for moving HCAs into pods' network namespaces (exclusive
		// RDMA netns mode), which the driver decides per claim.
		dcfg.HookPath = o.hookPath
	}
	if hca.HostNetlink(o.sysfsRoot) != nil {
		// Unprepare checks that moved HCAs are back in the host's namespace.
		deps.HostRDMA = rdmanl.Client{}
	}
	var shim *legacy.Plugin
	switch o.legacyRoute {
	case legacy.LegacyDRA:
		dcfg.LegacyShares = int64(o.legacyShares)
	case legacy.LegacyDevicePlugin:
		shim, err = legacy.New(legacy.Config{
			ResourceName:    o.legacyResourceName,
			Shares:          o.legacyShares,
			DevicePluginDir: filepath.Join(o.kubeletRootDir, "device-plugins"),
			CDI:             deps.SpecDir,
			EditOptions:     cdi.EditOptions{Env: true, HostDevRoot: o.runtimeDevRoot(), Network: legacyNetwork(o.allowNonHostNetwork)},
		})
		if err != nil {
			return err
		}
		dcfg.PreserveSpecs = []string{legacy.SpecUID}
		deps.OnInventory = func(inv hca.Inventory) {
			if err := shim.Update(inv); err != nil {
				logger.Error(err, "Updating the device-plugin shim")
			}
		}
	}
	d, err := driver.New(ctx, dcfg, deps)
	if err != nil {
		return err
	}
	if deps.KernelEvents != nil {
		if unseen := unseenNetdevs(d.Inventory()); len(unseen) > 0 {
			logger.Info("Netdevs outside this network namespace: their renames are seen at the next rescan, not as kernel events (run on the host network to change that)", "netdevs", unseen)
		}
	}
	if shim != nil {
		go func() {
			if err := shim.Run(ctx); err != nil {
				logger.Error(err, "Device-plugin shim stopped", "resource", o.legacyResourceName)
				stop()
			}
		}()
	}

	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(o.driverName),
		kubeletplugin.NodeName(o.nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
	}
	if o.podUID != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(types.UID(o.podUID)))
	}
	helperOpts = append(helperOpts, kubeletplugin.PluginSocket(draSocketName(o.podUID)))
	if o.deviceMetadata {
		// v1beta1 is the newest version in Kubernetes 1.37; a consumer reads
		// the first version it knows from the file's stream.
		helperOpts = append(helperOpts,
			kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}),
			kubeletplugin.CDIDirectory(o.cdiRoot))
	}
	helper, err := kubeletplugin.Start(ctx, d, helperOpts...)
	if err != nil {
		return fmt.Errorf("starting the kubelet plugin: %w", err)
	}
	// Stop the helper first on the way out: it stops taking calls and
	// drains the ones in flight before the process ends.
	defer helper.Stop()
	if err := d.SetPublisher(ctx, helper); err != nil {
		return err
	}

	go newForeignAdvertiser(client, o, m.Registry).run(ctx, foreignCheckInterval)

	servers := startHTTP(ctx, o, m, helper, pluginDir)
	defer func() {
		for _, s := range servers {
			shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = s.Shutdown(shutdownCtx)
			cancel()
		}
	}()

	logger.Info("Driver started", "pluginDir", pluginDir, "cdiRoot", o.cdiRoot, "state", stateDir)
	d.Run(ctx)
	logger.Info("Shutting down", "cause", context.Cause(ctx))
	return nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

func startHTTP(ctx context.Context, o *options, m *driver.Metrics, helper *kubeletplugin.Helper, pluginDir string) []*http.Server {
	logger := klog.FromContext(ctx)
	var servers []*http.Server
	serve := func(addr string, mux *http.ServeMux) {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			logger.Error(err, "Cannot listen", "address", addr)
			return
		}
		s := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		servers = append(servers, s)
		go func() { _ = s.Serve(l) }()
		logger.Info("Serving HTTP", "address", l.Addr().String())
	}
	if o.metricsAddress != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.HandlerFor(m.Registry, metrics.HandlerOpts{}))
		serve(o.metricsAddress, mux)
	}
	if o.healthzAddress != "" {
		check := &socketCheck{
			registrationSocket: filepath.Join(o.kubeletRootDir, "plugins_registry", o.driverName+"-reg.sock"),
			draSocket:          filepath.Join(pluginDir, draSocketName(o.podUID)),
			helper:             helper,
		}
		if o.podUID != "" {
			dir := filepath.Join(o.kubeletRootDir, "plugins_registry")
			check.registrationSocket = filepath.Join(dir, kubeletplugin.RollingUpdateRegistrarSocketFile(dir, o.driverName, types.UID(o.podUID)))
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", check.serveHealthz)
		mux.HandleFunc("/readyz", check.serveReadyz)
		serve(o.healthzAddress, mux)
	}
	return servers
}

// draSocketName is set explicitly so the health check dials the socket the
// helper listens on; in rolling-update mode each instance has its own.
func draSocketName(podUID string) string {
	if podUID == "" {
		return "dra.sock"
	}
	return "dra-" + podUID + ".sock"
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
