package draplugin

// The claim's status (KEP-4817): after a prepare the driver tells humans
// and controllers which netdev each prepared HCA has (name, addresses,
// MAC) and how its port is, in status.devices; it removes its entries on
// unprepare. The identity and run-time fields the slice leaves out
// (docs/attributes.md) live here and in the metadata file.
//
// None of it runs in the kubelet's call: prepare and unprepare only record
// what to write (latest wins per claim) and a worker applies it, retrying
// with backoff. A status that is late or lost costs a reader, never a pod.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// Condition types and reasons of a prepared device's status.
const (
	ConditionReady  = "Ready"
	ConditionLinkUp = "LinkUp"
	ReasonPrepared  = "Prepared"
	ReasonActive    = "PortActive"
)

// maxStatusIPs is the API's limit on networkData.ips.
const maxStatusIPs = 16

// claimStatus queues and applies status.devices of prepared claims.
type claimStatus struct {
	client  resourceclient.ResourceClaimsGetter
	driver  string
	node    string
	netdevs NetdevReader // nil: no hardware address
	// lookup finds a netdev in the daemon's network namespace
	// (net.InterfaceByName); tests replace it.
	lookup func(name string) (*net.Interface, error)

	mu      sync.Mutex
	pending map[types.UID]statusJob // latest wins
	queue   workqueue.TypedRateLimitingInterface[types.UID]
}

// statusJob is what a claim's status should say: its prepared devices, or
// none (unprepared: remove ours).
type statusJob struct {
	namespace, name string
	devices         []statusDevice
}

type statusDevice struct {
	dev    checkpoint.Device
	hca    hca.HCA // zero for the legacy device
	legacy bool
}

func newClaimStatus(client resourceclient.ResourceClaimsGetter, driver, node string, netdevs NetdevReader) *claimStatus {
	return &claimStatus{
		client: client, driver: driver, node: node, netdevs: netdevs, lookup: net.InterfaceByName,
		pending: map[types.UID]statusJob{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](500*time.Millisecond, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "claim-status"}),
	}
}

// prepared records that claim c is prepared, with the HCAs of v it was
// prepared with. Cheap (no I/O); nothing on a nil claimStatus.
func (s *claimStatus) prepared(cfg *Config, v *view, c checkpoint.Claim) {
	if s == nil {
		return
	}
	job := statusJob{namespace: c.Namespace, name: c.Name, devices: []statusDevice{}}
	for _, dev := range c.Devices {
		sd := statusDevice{dev: dev, legacy: cfg.isLegacy(dev.Device)}
		if h, ok := v.byDevice[dev.Device]; ok {
			sd.hca = h
		}
		job.devices = append(job.devices, sd)
	}
	s.set(types.UID(c.UID), job)
}

// unprepared records that the claims unprepared without error no longer
// have devices of ours.
func (s *claimStatus) unprepared(claims []kubeletplugin.NamespacedObject, results map[types.UID]error) {
	if s == nil {
		return
	}
	for _, c := range claims {
		if results[c.UID] == nil {
			s.set(c.UID, statusJob{namespace: c.Namespace, name: c.Name})
		}
	}
}

func (s *claimStatus) set(uid types.UID, job statusJob) {
	s.record(uid, job)
	s.queue.Add(uid)
}

func (s *claimStatus) record(uid types.UID, job statusJob) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending[uid] = job
}

func (s *claimStatus) job(uid types.UID) (statusJob, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	job, ok := s.pending[uid]
	return job, ok
}

// done forgets job, unless a newer one came meanwhile: it stays for its
// own turn.
func (s *claimStatus) done(uid types.UID, job statusJob) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if again, still := s.pending[uid]; still && sameJob(again, job) {
		delete(s.pending, uid)
	}
}

// run applies queued statuses until ctx ends.
func (s *claimStatus) run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	for {
		uid, shutdown := s.queue.Get()
		if shutdown {
			return
		}
		job, ok := s.job(uid)
		var err error
		if ok {
			err = s.apply(ctx, uid, job)
		}
		if err == nil {
			s.done(uid, job)
		}
		if err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "Writing the claim's device status; retrying", "claim", klog.KRef(job.namespace, job.name))
			s.queue.AddRateLimited(uid)
		} else {
			s.queue.Forget(uid)
		}
		s.queue.Done(uid)
	}
}

func sameJob(a, b statusJob) bool {
	return a.namespace == b.namespace && a.name == b.name && len(a.devices) == len(b.devices) &&
		(a.devices == nil) == (b.devices == nil) &&
		slices.EqualFunc(a.devices, b.devices, func(x, y statusDevice) bool { return x.dev.Device == y.dev.Device && x.dev.ShareID == y.dev.ShareID })
}

// apply writes the claim's entries of this driver with server-side apply:
// the devices of job, or none, which removes those it wrote before. The
// UID makes a claim recreated under the same name fail instead of getting
// another claim's devices. A claim that is gone, or replaced, needs nothing.
func (s *claimStatus) apply(ctx context.Context, uid types.UID, job statusJob) error {
	status := resourceac.ResourceClaimStatus()
	for _, sd := range job.devices {
		status.WithDevices(s.deviceStatus(sd))
	}
	claim := resourceac.ResourceClaim(job.name, job.namespace).WithUID(uid).WithStatus(status)
	_, err := s.client.ResourceClaims(job.namespace).ApplyStatus(ctx, claim, metav1.ApplyOptions{FieldManager: s.driver, Force: true})
	switch {
	case err == nil, apierrors.IsNotFound(err), apierrors.IsConflict(err) && job.devices == nil:
		return nil
	case apierrors.IsInvalid(err) || apierrors.IsConflict(err) || apierrors.IsForbidden(err):
		// Retrying cannot help: the claim was replaced or deallocated, our
		// status is wrong, or the daemon lacks the RBAC (which the log
		// must say).
		klog.FromContext(ctx).Error(err, "The API server refused the claim's device status; not retrying", "claim", klog.KRef(job.namespace, job.name))
		return nil
	}
	return err
}

// deviceStatus is one prepared device's entry.
func (s *claimStatus) deviceStatus(sd statusDevice) *resourceac.AllocatedDeviceStatusApplyConfiguration {
	now := metav1.Now()
	out := resourceac.AllocatedDeviceStatus().WithDriver(s.driver).WithPool(sd.dev.Pool).WithDevice(sd.dev.Device)
	if sd.dev.ShareID != "" {
		out.WithShareID(sd.dev.ShareID)
	}
	ready := fmt.Sprintf("prepared on node %s", s.node)
	if sd.legacy {
		ready += ": every usable HCA of the node"
	} else if sd.hca.Name != "" {
		ready += ": HCA " + sd.hca.Name
	}
	out.WithConditions(metav1ac.Condition().WithType(ConditionReady).WithStatus(metav1.ConditionTrue).
		WithReason(ReasonPrepared).WithMessage(ready).WithLastTransitionTime(now))
	h := sd.hca
	if h.Name == "" {
		return out
	}
	if len(h.Ports) > 0 {
		p := h.Ports[0]
		status, reason := metav1.ConditionFalse, portReason(p.State)
		if p.Active() {
			status, reason = metav1.ConditionTrue, ReasonActive
		}
		out.WithConditions(metav1ac.Condition().WithType(ConditionLinkUp).WithStatus(status).WithReason(reason).
			WithMessage(fmt.Sprintf("port %d %s, physical state %s, %g Gb/s, at prepare", p.Number, orUnknown(p.State), orUnknown(p.PhysState), p.RateGbps)).
			WithLastTransitionTime(now))
	}
	if nd := s.networkData(h); nd != nil {
		out.WithNetworkData(nd)
	}
	if data, err := json.Marshal(statusData(h)); err == nil {
		out.WithData(runtime.RawExtension{Raw: data})
	}
	return out
}

// portReason turns a port state into a condition reason (CamelCase).
func portReason(state string) string {
	if state == "" {
		return "PortStateUnknown"
	}
	return "Port" + strings.ToUpper(state[:1]) + strings.ToLower(state[1:])
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// deviceData is status.devices[].data: what tools need to find the HCA.
type deviceData struct {
	IBDev        string `json:"ibdev"`
	Uverbs       string `json:"uverbs,omitempty"`
	LID          *int   `json:"lid,omitempty"`
	RoCEGIDIndex *int   `json:"roceGIDIndex,omitempty"`
}

func statusData(h hca.HCA) deviceData {
	out := deviceData{IBDev: h.Name}
	if h.Uverbs != nil {
		out.Uverbs = h.Uverbs.Path
	}
	if len(h.Ports) > 0 {
		p := h.Ports[0]
		if p.LinkLayer == hca.LinkLayerInfiniBand {
			out.LID = &p.LID
		}
		if p.RoCEv2GIDIndex >= 0 {
			out.RoCEGIDIndex = &p.RoCEv2GIDIndex
		}
	}
	return out
}

// statusNetdev is the netdev that carries the HCA's traffic: its first
// port's (RDMA netlink), else that of its RoCE v2 GID, else a software
// device's parent, else the first of its netdevs (IPoIB on InfiniBand).
func statusNetdev(h hca.HCA) string {
	if len(h.Ports) > 0 {
		p := h.Ports[0]
		if p.Netdev != "" {
			return p.Netdev
		}
		for _, g := range p.GIDs {
			if g.Index == p.RoCEv2GIDIndex && g.Netdev != "" {
				return g.Netdev
			}
		}
	}
	if h.ParentNetdev != "" {
		return h.ParentNetdev
	}
	if len(h.Netdevs) > 0 {
		return h.Netdevs[0]
	}
	return ""
}

// networkData names the HCA's netdev, its MAC (sysfs) and its addresses:
// from rtnetlink with their prefixes when the daemon's namespace holds that
// very netdev (same ifindex and MAC as sysfs: on the host network), else
// the addresses in the GID table, whose entries have no prefix length.
func (s *claimStatus) networkData(h hca.HCA) *resourceac.NetworkDeviceDataApplyConfiguration {
	name := statusNetdev(h)
	if name == "" {
		return nil
	}
	out := resourceac.NetworkDeviceData().WithInterfaceName(name)
	var sysfs hca.NetdevAddress
	var err error = errors.New("no sysfs reader")
	if s.netdevs != nil {
		sysfs, err = s.netdevs.Netdev(name)
	}
	if err == nil && sysfs.HardwareAddress != "" {
		out.WithHardwareAddress(sysfs.HardwareAddress)
	}
	var ips []string
	if iface, lerr := s.lookup(name); err == nil && lerr == nil && iface.Index == sysfs.Ifindex &&
		strings.EqualFold(iface.HardwareAddr.String(), sysfs.HardwareAddress) {
		if addrs, aerr := iface.Addrs(); aerr == nil {
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok {
					ips = append(ips, n.String())
				}
			}
		}
	} else {
		ips = gidAddresses(h, name)
	}
	if len(ips) > maxStatusIPs {
		ips = ips[:maxStatusIPs]
	}
	if len(ips) > 0 {
		out.WithIPs(ips...)
	}
	return out
}

// gidAddresses are the IP addresses in the GID tables of the HCA's ports
// that name netdev: IPv4-mapped GIDs as /32, global IPv6 ones as /128.
// Link-local GIDs are left out: the kernel derives the default one from
// the MAC whether or not the netdev has that address.
func gidAddresses(h hca.HCA, netdev string) []string {
	var out []string
	for _, p := range h.Ports {
		for _, g := range p.GIDs {
			if g.Netdev != netdev {
				continue
			}
			ip := parseGID(g.GID)
			if ip == nil || ip.IsLinkLocalUnicast() || ip.IsUnspecified() {
				continue
			}
			cidr := ip.String() + "/128"
			if ip.To4() != nil {
				cidr = ip.To4().String() + "/32"
			}
			if !slices.Contains(out, cidr) {
				out = append(out, cidr)
			}
		}
	}
	return out
}

// parseGID reads a GID as the kernel prints it (eight groups of four hex
// digits) as an IPv6 address.
func parseGID(gid string) net.IP {
	ip := net.ParseIP(gid)
	if ip == nil || len(ip) != net.IPv6len {
		return nil
	}
	return ip
}
