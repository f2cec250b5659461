package draplugin

// What the driver needs from outside: every method it calls on a
// collaborator is listed here, so a fake that lacks one does not compile.

import (
	"context"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/kevents"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// HCASource is what the driver reads of the node's HCAs: *hca.Discoverer.
type HCASource interface {
	Discoverer
	PKeyReader
	PortStater
	NetdevReader
}

// Discoverer takes inventories: the slow path's full walk of sysfs.
type Discoverer interface {
	Discover() (hca.Inventory, error)
	// Invalidate makes the next Discover read everything again, not only
	// what changes without an event.
	Invalidate()
}

// PKeyReader reads a port's P_Key table on demand: a table is 128 entries
// on InfiniBand, too many for every rescan, so only claims that name a
// partition pay for it.
type PKeyReader interface {
	PKeys(ibdev string, port int) ([]hca.PKey, error)
}

// PortStater is the cheap change detector of the port watcher.
type PortStater interface {
	PortStates() (map[string]string, error)
}

// NetdevReader reads a netdev's hardware address from sysfs: the host's,
// even when the daemon has its own network namespace.
type NetdevReader interface {
	Netdev(name string) (hca.NetdevAddress, error)
}

// SlicePublisher publishes ResourceSlices: *kubeletplugin.Helper.
type SlicePublisher interface {
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

// HostRDMA lists the RDMA devices of the daemon's network namespace:
// rdmanl.Client on a node, where the daemon runs on the host network.
// Unprepare asks it whether moved HCAs are back.
type HostRDMA interface {
	Devices() ([]rdmanl.Device, error)
}

// HostLinks tells why the node's own traffic needs one of the host's
// netdevs: rdmanl.RouteClient on a node (the daemon is on the host network).
type HostLinks interface {
	// NetdevUse is "carries the node's default route", "holds the node's
	// InternalIP <ip>", or ""; a netdev it cannot find is an error.
	NetdevUse(name string, nodeIPs []netip.Addr) (string, error)
}

// NodeIPs reads the Node's InternalIPs.
type NodeIPs interface {
	InternalIPs(ctx context.Context) ([]netip.Addr, error)
}

// CDISpecs is the directory of the claims' CDI specs: *cdi.SpecDir.
type CDISpecs interface {
	Dir() string
	Path(claimUID string) string
	WriteClaim(claimUID string, common cdispec.ContainerEdits, devices []cdi.ClaimDevice) error
	RemoveClaim(claimUID string) error
	ClaimUIDs() ([]string, error)
	RemoveStaleTemps(olderThan time.Time) ([]string, error)
}

// CheckpointStore is the record of prepared claims: *checkpoint.Store.
type CheckpointStore interface {
	Path() string
	Load() (checkpoint.Checkpoint, error)
	Update(fn func(cp *checkpoint.Checkpoint) error) error
	Quarantine() (string, error)
	RemoveStaleTemps(olderThan time.Time) ([]string, error)
}

var (
	_ HCASource       = (*hca.Discoverer)(nil)
	_ CDISpecs        = (*cdi.SpecDir)(nil)
	_ CheckpointStore = (*checkpoint.Store)(nil)
)

// Deps are the driver's collaborators; tests pass simulated ones.
type Deps struct {
	HCAs       HCASource
	Pods       PodGetter // may be nil when AllowNonHostNetwork is set
	SpecDir    CDISpecs
	Checkpoint CheckpointStore
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
