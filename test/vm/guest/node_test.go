package guest

// The node in the guest: the driver (pkg/draplugin, wired as the daemon wires
// it: real discovery with RDMA netlink, kernel events, the kubelet plugin
// helper on real unix sockets) with a fake API client holding the claims
// (there is no API server in the VM). The test plays the kubelet over the
// driver's gRPC socket.

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/kevents"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

const (
	driverName = "rdma.dra.dev"
	nodeName   = "vm"
)

type node struct {
	t         *testing.T
	client    *fake.Clientset
	drv       *draplugin.Driver
	dra       drapb.DRAPluginClient
	conn      *grpc.ClientConn
	cdiDir    string
	pluginDir string
}

// nodeConfig is what differs between scenarios.
type nodeConfig struct {
	shares, legacyShares int64
	// hcaHandles/hcaObjects publish the RDMA cgroup capacities (shared
	// mode), enforced by the hook at hookPath.
	hcaHandles, hcaObjects int64
	hookPath               string
	// memlock: the RLIMIT_MEMLOCK the hook gives every container of a
	// claim (draplugin.Config.Memlock); empty: no memlock hook.
	memlock string
	// defaultHCAHandles/Objects: the limits of a claim that asks for none.
	defaultHCAHandles, defaultHCAObjects int64
	// hostNetworkOnly turns non-hostNetwork RDMA off (needs pods).
	hostNetworkOnly bool
	// pods: the driver looks the claims' pods up (n.pod creates them);
	// exclusive netns mode needs it. hostRDMA: unprepare checks moved
	// HCAs came back over RDMA netlink.
	pods, hostRDMA bool
	// rescan is the periodic rescan (default 10 s).
	rescan time.Duration
}

// podGetter reads pods from the fake API client.
type podGetter struct{ client *fake.Clientset }

func (p podGetter) GetPod(ctx context.Context, namespace, name string, _ types.UID) (*corev1.Pod, error) {
	return p.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

// pod creates the pod a claim made by n.claim(name, ...) is reserved for.
func (n *node) pod(name string, hostNetwork bool) {
	n.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("pod-" + name)},
		Spec: corev1.PodSpec{NodeName: nodeName, HostNetwork: hostNetwork}}
	if _, err := n.client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		n.t.Fatal(err)
	}
}

// startNode starts the driver; it stops when the test ends.
func startNode(t *testing.T, nc nodeConfig) *node {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "node-")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, client: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-uid"}}),
		cdiDir: filepath.Join(dir, "cdi"), pluginDir: filepath.Join(dir, "plugins", driverName)}
	registry := filepath.Join(dir, "plugins_registry")
	for _, d := range []string{n.cdiDir, n.pluginDir, registry} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	bootID, err := checkpoint.BootIDFrom("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	deps := draplugin.Deps{
		HCAs:       hca.NewDiscoverer(hca.WithNetlink(hca.HostNetlink("/sys"))),
		SpecDir:    cdi.NewSpecDir(n.cdiDir),
		Checkpoint: checkpoint.NewStore(filepath.Join(n.pluginDir, "checkpoint.json")),
		BootID:     bootID,
	}
	if nc.pods {
		deps.Pods = podGetter{n.client}
	}
	if nc.hostRDMA {
		deps.HostRDMA = rdmanl.Client{}
	}
	w, err := kevents.Open()
	if err != nil {
		t.Fatalf("kernel events: %v", err)
	}
	deps.KernelEvents = w.Events()
	drv, err := draplugin.New(ctx, draplugin.Config{
		DriverName: driverName, NodeName: nodeName, HostDevRoot: "/dev",
		AllowNonHostNetwork: !nc.hostNetworkOnly, RescanInterval: cmp.Or(nc.rescan, 10*time.Second),
		Shares: nc.shares, LegacyShares: nc.legacyShares,
		TaintUnhealthy: true, PortPollInterval: 250 * time.Millisecond, HookPath: nc.hookPath, Memlock: nc.memlock,
		Limits: draplugin.HCALimits{Handles: nc.hcaHandles, Objects: nc.hcaObjects,
			DefaultHandles: nc.defaultHCAHandles, DefaultObjects: nc.defaultHCAObjects},
	}, deps)
	if err != nil {
		t.Fatalf("starting the driver: %v", err)
	}
	helper, err := kubeletplugin.Start(ctx, drv,
		kubeletplugin.DriverName(driverName), kubeletplugin.NodeName(nodeName), kubeletplugin.KubeClient(n.client),
		kubeletplugin.PluginDataDirectoryPath(n.pluginDir), kubeletplugin.RegistrarDirectoryPath(registry))
	if err != nil {
		t.Fatalf("starting the kubelet plugin: %v", err)
	}
	if err := drv.SetPublisher(ctx, helper); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { drv.Run(ctx); close(done) }()
	conn, err := grpc.NewClient("unix://"+filepath.Join(n.pluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	n.drv, n.conn, n.dra = drv, conn, drapb.NewDRAPluginClient(conn)
	t.Cleanup(func() {
		conn.Close()
		helper.Stop()
		cancel()
		<-done
		w.Close()
		os.RemoveAll(dir)
	})
	return n
}

// claim creates a claim allocated to devices (DRA device names), each
// with share ID shares[i] when given, as the scheduler would leave it.
func (n *node) claim(name string, devices []string, shares ...string) *resourceapi.ResourceClaim {
	n.t.Helper()
	return n.claimConsuming(name, nil, devices, shares...)
}

// claimConsuming is claim with capacities consumed on every device (name
// without the driver's prefix -> amount), as the scheduler records them.
func (n *node) claimConsuming(name string, consumed map[string]int64, devices []string, shares ...string) *resourceapi.ResourceClaim {
	n.t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)}}
	alloc := &resourceapi.AllocationResult{}
	for i, d := range devices {
		r := resourceapi.DeviceRequestAllocationResult{Request: "hca", Driver: driverName, Pool: nodeName, Device: d}
		if i < len(shares) {
			id := types.UID(shares[i])
			r.ShareID = &id
		}
		if consumed != nil {
			r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
			for k, v := range consumed {
				r.ConsumedCapacity[resourceapi.QualifiedName(driverName+"/"+k)] = *resource.NewQuantity(v, resource.DecimalSI)
			}
		}
		alloc.Devices.Results = append(alloc.Devices.Results, r)
	}
	c.Status.Allocation = alloc
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name, UID: types.UID("pod-" + name)}}
	if _, err := n.client.ResourceV1().ResourceClaims(c.Namespace).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		n.t.Fatal(err)
	}
	return c
}

// prepare plays the kubelet's NodePrepareResources for one claim and
// returns its CDI device IDs.
func (n *node) prepare(c *resourceapi.ResourceClaim) []string {
	n.t.Helper()
	resp, err := n.dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil {
		n.t.Fatalf("NodePrepareResources: %v", err)
	}
	r := resp.Claims[string(c.UID)]
	if r == nil || r.Error != "" {
		n.t.Fatalf("preparing %s: %+v", c.Name, r)
	}
	var ids []string
	for _, d := range r.Devices {
		ids = append(ids, d.CdiDeviceIds...)
	}
	return ids
}

// unprepare plays NodeUnprepareResources.
func (n *node) unprepare(c *resourceapi.ResourceClaim) {
	n.t.Helper()
	resp, err := n.dra.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil {
		n.t.Fatalf("NodeUnprepareResources: %v", err)
	}
	if e := resp.Claims[string(c.UID)].GetError(); e != "" {
		n.t.Errorf("unpreparing %s: %s", c.Name, e)
	}
}

// slice returns the published ResourceSlice once there is exactly one.
func (n *node) slice(ctx context.Context) (*resourceapi.ResourceSlice, error) {
	var s *resourceapi.ResourceSlice
	err := poll.Until(ctx, "one ResourceSlice", 20*time.Millisecond, time.Minute, func(ctx context.Context) (bool, string, error) {
		list, err := n.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		if len(list.Items) != 1 {
			return false, fmt.Sprintf("%d slices", len(list.Items)), nil
		}
		s = &list.Items[0]
		return true, "", nil
	})
	return s, err
}
