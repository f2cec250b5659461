// Package draplugin is the DRA kubelet plugin of rdma.dra.dev: it publishes the
// node's HCAs and prepares claims for the kubelet.
//
// Two paths, kept apart on purpose:
//   - slow (publish.go): discovery walks sysfs and the result is published as
//     ResourceSlices, at start and on every rescan;
//   - hot (prepare.go): PrepareResourceClaims and UnprepareResourceClaims run
//     while pods wait to start. They read the inventory from memory, pods from
//     an informer cache, and touch the disk only to write the claim's CDI spec
//     and one checkpoint update per call. No sysfs walk, no API call.
package draplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/kevents"
)

// Inventory is where HCAs come from: *hca.Discoverer on a node.
type Inventory interface {
	Discover() (hca.Inventory, error)
}

// PKeyReader reads a port's P_Key table on demand (*hca.Discoverer): a
// table is 128 entries on InfiniBand, too many for every rescan, so only
// claims that name a partition pay for it.
type PKeyReader interface {
	PKeys(ibdev string, port int) ([]hca.PKey, error)
}

// Invalidator is an inventory that keeps what it read between discoveries
// (*hca.Discoverer): Invalidate makes the next one read everything.
type Invalidator interface {
	Invalidate()
}

// Publisher publishes ResourceSlices: *kubeletplugin.Helper.
type Publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// PodGetter finds the pods a claim is reserved for (for the hostNetwork
// policy). It should serve from an informer; see NewPodInformer.
type PodGetter interface {
	// GetPod returns the pod namespace/name, preferably the one with uid:
	// a cache may still hold an older pod of the same name (a StatefulSet
	// pod recreated), and must then ask the API server.
	GetPod(ctx context.Context, namespace, name string, uid types.UID) (*corev1.Pod, error)
}

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
	// HCAHandles and HCAObjects > 0 (shared mode) publish the RDMA cgroup
	// capacities; a claim's consumed amounts become its containers'
	// rdma.max through HookPath. Zero where the kernel lacks the controller.
	HCAHandles, HCAObjects int64
	// DefaultHCAHandles and DefaultHCAObjects (> 0) are the limits a claim
	// on a shared HCA gets when it asks for none, where the capacities
	// above are published; RequireHCALimits refuses such a claim instead
	// (see policy.go).
	DefaultHCAHandles, DefaultHCAObjects int64
	RequireHCALimits                     bool
	// HookPath is the host path of rdma-dra-hook, named in the CDI specs of
	// claims with limits, of every device while AllowNonHostNetwork is off
	// (the container-start check; without a HookPath only prepare checks),
	// and of claims whose HCAs move into a pod's
	// network namespace (exclusive RDMA netns mode); required when the
	// capacities are published, and for pods off the host network in
	// exclusive mode.
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
}

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	cfg     Config
	source  Inventory
	pods    PodGetter
	specs   *cdi.SpecDir
	store   *checkpoint.Store
	meta    metadataFiles // meta.dataDir "": no metadata files
	bootID  string
	metrics *Metrics
	kernel  <-chan kevents.Event
	// hostRDMA, if set, tells unprepare whether moved HCAs are back.
	hostRDMA HostRDMA
	// hostLinks and nodeIPSource check moveNetdev (uplink.go); without
	// them no netdev moves.
	hostLinks    HostLinks
	nodeIPSource NodeIPs
	// returnChecks are the background checks that moved HCAs came back.
	returnChecks sync.WaitGroup

	// scanMu orders rescans: the ticker, the port watcher and kernel
	// events may ask at once, and a slower discovery must not swap in an
	// older view after a newer one.
	scanMu sync.Mutex
	// pubMu orders publishes the same way.
	pubMu sync.Mutex

	draining atomic.Bool // set by Drain: calls after it do nothing

	mu        sync.Mutex // guards the fields below
	scanned   bool       // inv holds a discovery
	inv       hca.Inventory
	byDevice  map[string]hca.HCA // usable HCAs by DRA device name
	publisher Publisher
	published *resourceslice.DriverResources
	backoff   time.Duration // of the next republish after a refused one

	retryCh chan struct{}
	onInv   func(hca.Inventory)

	// orphanSpecs are CDI specs found after a corrupt checkpoint was moved
	// aside: their claims may still be prepared, so only an unprepare
	// removes them. Set in New, read-only after.
	orphanSpecs map[string]bool

	taintedSince  map[string]metav1.Time // by device name; guarded by mu
	healthChanged chan struct{}          // closed on every inventory change; guarded by mu

	status *claimStatus // nil: claims' status.devices are not written

	nodeIPs []netip.Addr // the Node's InternalIPs as last read; guarded by mu
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// Deps are the driver's collaborators; tests pass simulated ones.
type Deps struct {
	Inventory  Inventory
	Pods       PodGetter // may be nil when AllowNonHostNetwork is set
	SpecDir    *cdi.SpecDir
	Checkpoint *checkpoint.Store
	BootID     string
	Metrics    *Metrics // nil: a private registry
	// KernelEvents, if set, are the kernel's link and uevent notifications
	// (kevents.Watcher.Events): each burst triggers a rescan.
	KernelEvents <-chan kevents.Event
	// OnInventory, if set, sees every new inventory (the device-plugin shim
	// follows the same discovery). It runs on the slow path.
	OnInventory func(hca.Inventory)
	// HostRDMA, if set, lists the RDMA devices of the host's network
	// namespace (rdmanl.Client): unprepare checks with it that HCAs moved
	// into a pod's namespace came back.
	HostRDMA HostRDMA
	// Claims, if set, is where prepared claims' status.devices are written
	// (status.go).
	Claims resourceclient.ResourceClaimsGetter
	// HostLinks and NodeIPs let a claim move its HCA's netdevs (moveNetdev)
	// after checking none carries the node's own traffic (uplink.go):
	// rdmanl.RouteClient and NodeGetter. Without them such claims fail.
	HostLinks HostLinks
	NodeIPs   NodeIPs
	// BootTime returns when the node booted; nil is the kernel's
	// (checkpoint.BootTime). New compares an unreadable checkpoint's mtime
	// with it: one last written before this boot is what a power loss left
	// of an earlier boot's file (checkpoint.BootScoped), said quietly.
	BootTime func() (time.Time, error)
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
func New(ctx context.Context, cfg Config, deps Deps) (*Driver, error) {
	logger := klog.FromContext(ctx)
	if cfg.DriverName == "" || cfg.NodeName == "" {
		return nil, errors.New("driver name and node name are required")
	}
	if cfg.HostDevRoot == "" {
		cfg.HostDevRoot = "/dev"
	}
	if cfg.LegacyShares > 0 && cfg.Shares == 0 {
		return nil, errors.New("the legacy device hands every HCA to every rdma/hca pod, so it needs shared mode (--sharing=shared)")
	}
	if (cfg.HCAHandles > 0 || cfg.HCAObjects > 0) && (cfg.Shares == 0 || cfg.HookPath == "") {
		return nil, errors.New("RDMA cgroup limits need shared mode and the hook's host path")
	}
	if cfg.DeviceMetadata && cfg.PluginDataDir == "" {
		return nil, errors.New("device metadata needs the plugin data directory")
	}
	if !cfg.AllowNonHostNetwork && deps.Pods == nil {
		return nil, errors.New("a pod lookup is required to enforce the hostNetwork policy")
	}
	d := &Driver{
		cfg:     cfg,
		source:  deps.Inventory,
		pods:    deps.Pods,
		specs:   deps.SpecDir,
		store:   deps.Checkpoint,
		bootID:  deps.BootID,
		metrics: deps.Metrics,
		onInv:   deps.OnInventory,
		kernel:  deps.KernelEvents,
		retryCh: make(chan struct{}, 1),

		hostRDMA:     deps.HostRDMA,
		hostLinks:    deps.HostLinks,
		nodeIPSource: deps.NodeIPs,
		meta:         metadataFiles{driver: cfg.DriverName, dataDir: cfg.PluginDataDir, cdiDir: deps.SpecDir.Dir()},

		healthChanged: make(chan struct{}),
	}
	if d.metrics == nil {
		d.metrics = NewMetrics()
	}
	if deps.Claims != nil {
		netdevs, _ := deps.Inventory.(NetdevReader)
		d.status = newClaimStatus(deps.Claims, cfg.DriverName, cfg.NodeName, netdevs)
	}
	quarantined := false
	if _, err := d.store.Load(); errors.Is(err, checkpoint.ErrCorrupt) {
		bootTime := deps.BootTime
		if bootTime == nil {
			bootTime = checkpoint.BootTime
		}
		if err := d.quarantineCheckpoint(ctx, err, bootTime); err != nil {
			return nil, err
		}
		quarantined = true
	} else if err != nil {
		return nil, err
	}
	if err := d.readNodeIPs(ctx); err != nil {
		// Prepare reads them again before any netdev moves.
		logger.Error(err, "Cannot read the Node's InternalIPs; claims that move netdevs read them at prepare")
	}
	if err := d.discardPreviousBoot(ctx); err != nil {
		return nil, err
	}
	if _, err := d.rescan(ctx); err != nil {
		return nil, err
	}
	if why := d.sharingConflict(d.Inventory()); why != "" {
		return nil, errors.New(why)
	}
	if d.Inventory().NetnsMode == hca.NetnsExclusive && cfg.AllowNonHostNetwork && cfg.HookPath == "" {
		logger.Info("Warning: exclusive RDMA netns mode and no --hook-path: claims of pods that are not on the host network will be refused (their HCAs cannot be moved into the pods' namespaces)")
	}
	if quarantined {
		uids, err := d.specs.ClaimUIDs()
		if err != nil {
			return nil, fmt.Errorf("listing CDI specs: %w", err)
		}
		d.orphanSpecs = map[string]bool{}
		for _, uid := range uids {
			d.orphanSpecs[uid] = true
		}
		if len(uids) > 0 {
			logger.Info("Keeping the CDI specs found beside the corrupt checkpoint: running pods may restart containers with them; each goes when the kubelet unprepares its claim", "specs", len(uids))
		}
	}
	if err := d.recoverSpecs(ctx); err != nil {
		return nil, err
	}
	d.sweepSpecs(ctx, time.Now())
	return d, nil
}

// SetPublisher hands the driver the helper once it is started, and
// publishes the current inventory.
func (d *Driver) SetPublisher(ctx context.Context, p Publisher) error {
	d.mu.Lock()
	d.publisher = p
	d.published = nil
	d.mu.Unlock()
	return d.publish(ctx)
}

// deviceName is the DRA device name of an HCA.
func deviceName(h hca.HCA) string { return devices.DeviceName(h.Name) }

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// Inventory is the last discovered inventory.
func (d *Driver) Inventory() hca.Inventory {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inv
}
