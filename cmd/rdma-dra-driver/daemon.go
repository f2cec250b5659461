package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/internal/buildinfo"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/kevents"
	"github.com/rdma-dra/rdma-dra-driver/pkg/legacy"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// daemonDirs are where the daemon listens and keeps its state.
type daemonDirs struct {
	plugin, registry, state string
}

func (o *options) dirs() daemonDirs {
	d := daemonDirs{
		plugin:   filepath.Join(o.kubeletRootDir, "plugins", o.driverName),
		registry: filepath.Join(o.kubeletRootDir, "plugins_registry"),
		state:    o.stateDir,
	}
	if d.state == "" {
		d.state = d.plugin
	}
	return d
}

// daemon is the driver and what the process holds for it until it ends.
type daemon struct {
	driver  *draplugin.Driver
	metrics *draplugin.Metrics
	nodes   *cachedNodes
	shim    *legacy.Plugin   // nil unless --legacy=device-plugin
	events  *kevents.Watcher // nil without kernel events
}

// newDaemon builds the driver and its dependencies from the options. The
// pod informer starts here: the driver needs it from its first prepare.
func newDaemon(ctx context.Context, o *options, clients apiClients, dirs daemonDirs, build buildinfo.Info) (_ *daemon, err error) {
	logger := klog.FromContext(ctx)
	if err := makeDirs(o, dirs); err != nil {
		return nil, err
	}
	bootID, err := checkpoint.BootIDFrom(o.bootIDFile)
	if err != nil {
		return nil, fmt.Errorf("reading the boot ID: %w", err)
	}

	// Pods are looked up for the hostNetwork policy and, where every pod
	// may use RDMA, still for the GID hints (a pod network's GIDs are not
	// at the host's index).
	pods := draplugin.NewPodInformer(clients.kubelet, o.nodeName)
	if err := pods.Start(ctx); err != nil {
		return nil, err
	}
	// The Node's InternalIPs (moveNetdev) and the foreign-plugin check
	// read it from a watch.
	nodes := newCachedNodes(clients.publish, o.nodeName)
	if err := nodes.Start(ctx, 10*time.Second); err != nil {
		logger.Error(err, "Node watch")
	}
	dmn := &daemon{metrics: draplugin.NewMetrics(), nodes: nodes}
	registerBuildInfo(dmn.metrics.Registry, build)
	specs := cdi.NewSpecDir(o.cdiRoot)
	deps := draplugin.Deps{
		// RDMA netlink adds the netns mode and soft-iWARP's netdev; only for
		// the host's /sys, never for a simulated tree.
		HCAs: hca.NewDiscoverer(hca.WithSysfsRoot(o.sysfsRoot), hca.WithDevRoot(o.devRoot),
			hca.WithNetlink(hca.HostNetlink(o.sysfsRoot)), hca.WithFullRescanInterval(o.fullRescanInterval)),
		SpecDir: specs,
		// Every claim is recorded with the boot ID, and a reboot discards
		// the claims of the previous boot: the checkpoint need only survive
		// kills, which it does without fsync (checkpoint.BootScoped).
		Checkpoint: checkpoint.NewStore(filepath.Join(dirs.state, "checkpoint.json"), checkpoint.BootScoped()),
		BootID:     bootID,
		Metrics:    dmn.metrics,
	}
	deps.Pods = pods
	if o.claimStatus {
		deps.Claims = clients.status.ResourceV1()
	}
	if o.kernelEvents {
		// Optional: without it, changes are still seen by the port watcher
		// and the rescan interval.
		if w, err := kevents.Open(); err != nil {
			logger.Error(err, "Kernel events unavailable; relying on polling", "rescanInterval", o.rescanInterval)
		} else {
			dmn.events = w
			deps.KernelEvents = w.Events()
		}
	}
	defer func() {
		if err != nil {
			dmn.close()
		}
	}()
	dcfg := driverConfig(logger, o, dirs.plugin)
	if hca.HostNetlink(o.sysfsRoot) != nil {
		// Unprepare checks that moved HCAs are back in the host's namespace.
		deps.HostRDMA = rdmanl.Client{}
	}
	// moveNetdev never moves the node's uplink (default route, InternalIP).
	deps.HostLinks = rdmanl.RouteClient{}
	deps.NodeIPs = draplugin.NodeGetter{Nodes: nodes, Name: o.nodeName}
	if o.legacyRoute == legacyDevicePlugin {
		shim, err := newShim(o, dcfg, specs)
		if err != nil {
			return nil, err
		}
		dcfg.PreserveSpecs = []string{legacy.SpecUID}
		deps.OnInventory = func(inv hca.Inventory) {
			if err := shim.Update(inv); err != nil {
				logger.Error(err, "Updating the device-plugin shim")
			}
		}
		dmn.shim = shim
	}
	if dmn.driver, err = draplugin.New(ctx, dcfg, deps); err != nil {
		return nil, err
	}
	if deps.KernelEvents != nil {
		if unseen := unseenNetdevs(dmn.driver.Inventory()); len(unseen) > 0 {
			logger.Info("Netdevs outside this network namespace: their renames are seen at the next rescan, not as kernel events (run on the host network to change that)", "netdevs", unseen)
		}
	}
	return dmn, nil
}

// makeDirs creates the directories the daemon and the kubelet meet in.
func makeDirs(o *options, dirs daemonDirs) error {
	all := []string{dirs.plugin, dirs.registry, dirs.state, o.cdiRoot}
	if o.legacyRoute == legacyDevicePlugin {
		all = append(all, filepath.Join(o.kubeletRootDir, "device-plugins"))
	}
	for _, dir := range all {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	return nil
}

// newShim is the device-plugin route's plugin, serving the CDI spec of its
// node-wide device from the driver's spec directory.
func newShim(o *options, dcfg draplugin.Config, specs *cdi.SpecDir) (*legacy.Plugin, error) {
	return legacy.New(legacy.Config{
		ResourceName:    o.legacyResourceName,
		Shares:          o.legacyShares,
		DevicePluginDir: filepath.Join(o.kubeletRootDir, "device-plugins"),
		CDI:             specs,
		EditOptions:     cdi.EditOptions{Env: true, HostDevRoot: o.runtimeDevRoot(), Network: legacyNetwork(o.allowNonHostNetwork)},
		Hooks:           legacyHooks(o, dcfg),
	})
}

// startShim serves the device-plugin route, if on; the daemon stops when
// the shim does.
func (dmn *daemon) startShim(ctx context.Context, o *options, stop context.CancelFunc) {
	if dmn.shim == nil {
		return
	}
	go func() {
		if err := dmn.shim.Run(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Device-plugin shim stopped", "resource", o.legacyResourceName)
			stop()
		}
	}()
}

func (dmn *daemon) close() {
	if dmn.events != nil {
		dmn.events.Close()
	}
}
