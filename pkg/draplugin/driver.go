// Package draplugin is the DRA kubelet plugin of rdma.dra.dev: it publishes the
// node's HCAs and prepares claims for the kubelet.
//
// Three parts, each with one reason to change:
//   - the plugin (Driver, plugin.go) adapts the kubelet's calls and records
//     their metrics;
//   - the claim state (claims.go) prepares and unprepares claims: the
//     checkpoint, the CDI spec and metadata writes, the reserve of devices
//     and the undo of a failure. It locks per claim, and holds its one
//     shared lock only to check and reserve devices in memory, never across
//     I/O, so the kubelet's calls for different claims run in parallel;
//   - the publisher (publish.go) discovers the HCAs (the slow path: a walk
//     of sysfs at start, on every rescan and after kernel events), and
//     publishes ResourceSlices, taints and device health. Each discovery is
//     a new view, which a prepare reads without a lock.
//
// A prepare reads the inventory from memory and pods from an informer
// cache; it reads P_Key tables from sysfs and the Node from the API server
// only for claims that ask for a partition or to move netdevs, before it
// takes any lock.
package draplugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	configapi "github.com/rdma-dra/rdma-dra-driver/api/rdma.dra.dev/v1alpha1"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/kevents"
)

// Config is what the daemon's flags decide.
type Config struct {
	DriverName string
	NodeName   string
	// HostDevRoot is where the container runtime finds device nodes (the
	// host's /dev, or a simulated node's dev directory).
	HostDevRoot string
	// AllowNonHostNetwork lets pods without hostNetwork use RDMA (ACK's
	// "Enable RDMA for non-hostNetwork" switch).
	AllowNonHostNetwork bool
	// RescanInterval is the safety-net period of rediscovery.
	RescanInterval time.Duration
	// Shares > 0 publishes every HCA shared, with that many shares
	// (--sharing=shared); zero is exclusive.
	Shares int64
	// LegacyShares > 0 publishes the legacy device standing for all HCAs
	// (--legacy=dra). Needs shared mode: its HCAs are shared.
	LegacyShares int64
	// TaintUnhealthy publishes a NoSchedule taint on HCAs whose port is not
	// ACTIVE, removed when it recovers.
	TaintUnhealthy bool
	// PortPollInterval is how often the port state files are checked
	// between rescans; zero disables the watcher.
	PortPollInterval time.Duration
	// Limits are the RDMA cgroup limits of claims on shared HCAs.
	Limits HCALimits
	// HookPath is the host path of rdma-dra-hook, named in the CDI specs of
	// claims with limits, of every device while AllowNonHostNetwork is off
	// (the container-start check; without a HookPath only prepare checks),
	// and of claims whose HCAs move into a pod's network namespace
	// (exclusive RDMA netns mode); required when the capacities are
	// published, and for pods off the host network in exclusive mode.
	HookPath string
	// DeviceMetadata writes each prepared request's device metadata file
	// (KEP-5304, see devices.Metadata and metadata.go) and its CDI spec,
	// and hands the kubelet the spec's device. The helper's own writer
	// (kubeletplugin.EnableDeviceMetadata) must then stay off.
	DeviceMetadata bool
	// PluginDataDir is the helper's plugin data directory: metadata files
	// go under it, as the helper lays them out. Required with
	// DeviceMetadata; when set without it, unprepare and the sweep still
	// remove the metadata files an earlier daemon wrote.
	PluginDataDir string
	// PreserveSpecs are claim UIDs of CDI specs in the same directory that
	// are not claims (the device-plugin shim's node-wide spec): start-up
	// cleanup leaves them alone.
	PreserveSpecs []string
	// Memlock is the RLIMIT_MEMLOCK the hook (HookPath) gives every
	// container that gets a device, unless its DeviceClass's config says
	// otherwise: "unlimited" or a quantity of bytes (--memlock). Empty: no
	// memlock hook (--memlock=off).
	Memlock string
}

// HCALimits are the RDMA cgroup capacities of shared HCAs (see policy.go).
type HCALimits struct {
	// Handles and Objects > 0 (shared mode) publish the capacities; a
	// claim's consumed amounts become its containers' rdma.max through
	// HookPath. Zero where the kernel lacks the controller.
	Handles, Objects int64
	// DefaultHandles and DefaultObjects (> 0) are the limits a claim on a
	// shared HCA gets when it asks for none, where the capacities above
	// are published; Require refuses such a claim instead.
	DefaultHandles, DefaultObjects int64
	Require                        bool
	// ClaimMaxPercent caps what one claim may consume of a capacity
	// (devices.ClaimCeiling; 0: all): published as the request policy's
	// maximum, and checked again at prepare. Defaults never exceed it.
	ClaimMaxPercent int64
}

// Driver is the kubelet plugin: it adapts the kubelet's calls to the claim
// state and the publisher, and records the calls' metrics.
type Driver struct {
	cfg     *Config
	claims  *claimState
	pub     *publisher
	facts   *factReader
	status  *claimStatus // nil: claims' status.devices are not written
	returns *returnChecks
	metrics *Metrics
	kernel  <-chan kevents.Event
	calls   callGate
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// validate fills in defaults and refuses contradictory settings.
func (cfg *Config) validate(deps Deps) error {
	if cfg.DriverName == "" || cfg.NodeName == "" {
		return errors.New("driver name and node name are required")
	}
	if cfg.HostDevRoot == "" {
		cfg.HostDevRoot = "/dev"
	}
	if cfg.LegacyShares > 0 && cfg.Shares == 0 {
		return errors.New("the legacy device hands every HCA to every rdma/hca pod, so it needs shared mode (--sharing=shared)")
	}
	if (cfg.Limits.Handles > 0 || cfg.Limits.Objects > 0) && (cfg.Shares == 0 || cfg.HookPath == "") {
		return errors.New("RDMA cgroup limits need shared mode and the hook's host path")
	}
	if cfg.Memlock != "" {
		m, err := configapi.ParseMemlock(cfg.Memlock)
		if err != nil {
			return fmt.Errorf("memlock: %w", err)
		}
		cfg.Memlock = m.String() // as the hook takes it, once
	}
	if cfg.DeviceMetadata && cfg.PluginDataDir == "" {
		return errors.New("device metadata needs the plugin data directory")
	}
	if !cfg.AllowNonHostNetwork && deps.Pods == nil {
		return errors.New("a pod lookup is required to enforce the hostNetwork policy")
	}
	if deps.HCAs == nil || deps.SpecDir == nil || deps.Checkpoint == nil {
		return errors.New("the HCA source, the CDI spec directory and the checkpoint are required")
	}
	return nil
}

// New recovers the driver's state and takes the first inventory.
//
// Recovery, in order: a corrupt checkpoint is moved aside (with an error, or
// a note if an earlier boot wrote it: see quarantineCheckpoint) and the
// driver starts empty rather than crash-looping, keeping the CDI
// specs it finds until their claims are unprepared; the specs of known
// claims are rewritten, because /var/run/cdi is a tmpfs that a reboot
// empties while the kubelet still considers the claims prepared; specs of
// unknown claims older than staleSpecAge are removed (a crash between
// writing the spec and the checkpoint leaves one).
func New(ctx context.Context, config Config, deps Deps) (*Driver, error) {
	logger := klog.FromContext(ctx)
	cfg := &config
	if err := cfg.validate(deps); err != nil {
		return nil, err
	}
	metrics := deps.Metrics
	if metrics == nil {
		metrics = NewMetrics()
	}
	ips := &nodeIPCache{}
	pub := newPublisher(cfg, deps.HCAs, deps.Checkpoint, metrics, deps.OnInventory)
	claims := newClaimState(cfg, deps, metrics, pub.current, ips)
	pub.onChange = claims.inventoryChanged
	d := &Driver{
		cfg:     cfg,
		claims:  claims,
		pub:     pub,
		facts:   &factReader{cfg: cfg, pods: deps.Pods, pkeys: deps.HCAs, hostLinks: deps.HostLinks, nodeIPs: deps.NodeIPs, ips: ips},
		returns: &returnChecks{hostRDMA: deps.HostRDMA, metrics: metrics},
		metrics: metrics,
		kernel:  deps.KernelEvents,
	}
	if deps.Claims != nil {
		d.status = newClaimStatus(deps.Claims, cfg.DriverName, cfg.NodeName, deps.HCAs)
	}
	quarantined := false
	if _, err := deps.Checkpoint.Load(); errors.Is(err, checkpoint.ErrCorrupt) {
		bootTime := deps.BootTime
		if bootTime == nil {
			bootTime = checkpoint.BootTime
		}
		if err := claims.quarantineCheckpoint(ctx, err, bootTime); err != nil {
			return nil, err
		}
		quarantined = true
	} else if err != nil {
		return nil, err
	}
	if err := d.facts.readNodeIPs(ctx); err != nil {
		// Prepare reads them again before any netdev moves.
		logger.Error(err, "Cannot read the Node's InternalIPs; claims that move netdevs read them at prepare")
	}
	if err := claims.discardPreviousBoot(ctx); err != nil {
		return nil, err
	}
	if _, err := pub.rescan(ctx); err != nil {
		return nil, err
	}
	inv := pub.current().inv
	if why := sharingConflict(cfg, inv); why != "" {
		return nil, errors.New(why)
	}
	if inv.NetnsMode == hca.NetnsExclusive && cfg.AllowNonHostNetwork && cfg.HookPath == "" {
		logger.Info("Warning: exclusive RDMA netns mode and no --hook-path: claims of pods that are not on the host network will be refused (their HCAs cannot be moved into the pods' namespaces)")
	}
	if quarantined {
		if err := claims.keepOrphanSpecs(ctx); err != nil {
			return nil, err
		}
	}
	if err := claims.recoverSpecs(ctx); err != nil {
		return nil, err
	}
	claims.sweep(ctx, time.Now())
	return d, nil
}

// SetPublisher hands the driver the helper once it is started, and
// publishes the current inventory.
func (d *Driver) SetPublisher(ctx context.Context, p SlicePublisher) error {
	return d.pub.setPublisher(ctx, p)
}

// Inventory is the last discovered inventory.
func (d *Driver) Inventory() hca.Inventory { return d.pub.current().inv }

// Rescan rediscovers the node now, everything read again, and republishes
// if anything changed: kernel events, the port watcher (and tests) call it.
// Run's periodic rescan re-reads only what changes without an event.
func (d *Driver) Rescan(ctx context.Context) error { return d.pub.Rescan(ctx) }

// Run rescans every RescanInterval and republishes on change, retries a
// publish the API server refused, sweeps what no prepared claim owns, and
// follows the port watcher, kernel events and the claim status writer,
// until ctx ends.
func (d *Driver) Run(ctx context.Context) {
	if d.kernel != nil {
		go d.pub.followKernel(ctx, d.kernel)
	}
	if d.status != nil {
		go d.status.run(ctx)
	}
	d.pub.run(ctx, func() { d.claims.sweep(ctx, time.Now()) })
}
