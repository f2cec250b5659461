// Package prepbench times the kubelet's path through the real daemon: the
// rdma-dra-driver binary as its own process with its default flags, an
// in-process kube-apiserver, a simulated node, and the benchmark playing
// the kubelet over the plugin socket with the kubelet's DRA gRPC client.
// A minimal driver (internal/drafloor) runs beside it, also as its own
// process, against the same API server, so every figure comes with the
// floor it is compared to.
package prepbench

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

const (
	nodeName   = "dgx01"
	driverName = "rdma.dra.dev"
	namespace  = "default"
	// hcaCount HCAs let 16 claims hold an HCA each at once in the
	// default exclusive mode, two per in-flight slot (see slotClaims).
	hcaCount = 32
)

// world is one control plane, one simulated node, the daemon serving it
// and a floor driver, with claims allocated and reserved for hostNetwork
// pods bound to the node, all made before the daemon starts (its pod
// informer has them).
type world struct {
	cp     *cluster.ControlPlane
	daemon *cluster.DriverProcess
	// metricsURL is the daemon's /metrics.
	metricsURL string
	dra        drapb.DRAPluginClient // the daemon's plugin socket
	floor      drapb.DRAPluginClient // the minimal driver's
	claims     []*drapb.Claim        // claim i is allocated HCA i % hcaCount
}

// benchDirs are a disk directory (the kubelet's root: the checkpoint and
// metadata files, as on a node) and a tmpfs one (CDI specs, /var/run/cdi;
// etcd, which on a real cluster is another machine's disk).
// RDMA_DRA_BENCH_DISK and RDMA_DRA_BENCH_TMPFS override /var/tmp and
// /dev/shm.
func benchDirs(b *testing.B) (disk, tmpfs string) {
	mk := func(env, def string) string {
		base := os.Getenv(env)
		if base == "" {
			base = def
		}
		dir, err := os.MkdirTemp(base, "pb") // short: unix sockets live under it
		if err != nil {
			b.Skipf("no directory for the benchmark under %s (%v); set %s", base, err, env)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return mk("RDMA_DRA_BENCH_DISK", "/var/tmp"), mk("RDMA_DRA_BENCH_TMPFS", "/dev/shm")
}

// newWorld starts everything with claims claims and the daemon's default
// flags; extraArgs are appended to them (none for the figures we report).
// The daemon is this tree's, or the binary RDMA_DRA_BENCH_DRIVER names
// (built by cluster.BuildDriver elsewhere, rdma-dra-hook beside it), to
// compare two builds.
func newWorld(b *testing.B, claims int, extraArgs ...string) *world {
	b.Helper()
	ctx := context.Background()
	disk, tmpfs := benchDirs(b)
	cp, err := cluster.StartControlPlane(b, filepath.Join(tmpfs, "cp"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cp.Stop)
	w := &world{cp: cp}
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	sim, err := hcatest.Build(filepath.Join(tmpfs, "node"), wideNode(hcaCount))
	if err != nil {
		b.Fatal(err)
	}
	for i := range claims {
		w.claims = append(w.claims, allocatedClaim(b, cp.Client, i))
	}

	binary := os.Getenv("RDMA_DRA_BENCH_DRIVER")
	if binary == "" {
		if binary, err = cluster.BuildDriver(disk); err != nil {
			b.Fatal(err)
		}
	}
	metricsAddr := freeAddr(b)
	w.metricsURL = "http://" + metricsAddr + "/metrics"
	kubeletDir := filepath.Join(disk, "k")
	// Only what places the daemon on this simulated node; every other
	// flag is the default.
	args := append([]string{"--node-name=" + nodeName, "--kubeconfig=" + cp.Kubeconfig,
		"--sysfs-root=" + sim.SysfsRoot, "--dev-root=" + sim.DevRoot, "--cdi-root=" + filepath.Join(tmpfs, "cdi"),
		"--kubelet-root-dir=" + kubeletDir, "--metrics-address=" + metricsAddr, "--healthz-address=127.0.0.1:0"}, extraArgs...)
	w.daemon, err = cluster.StartDriver(binary, args...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("daemon logs:\n%s", w.daemon.Logs())
		}
		w.daemon.Kill()
	})
	w.dra = register(b, w.daemon, filepath.Join(kubeletDir, "plugins_registry", driverName+"-reg.sock"))
	w.waitPublished(b)
	w.floor = startFloor(b, w, filepath.Join(disk, "floor"), filepath.Join(kubeletDir, "plugins_registry"))
	return w
}

// freeAddr is a loopback address no one listens on now.
func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// wideNode is the dgx-h100 preset's first ConnectX-7 repeated n times,
// each with its own PCI function, GUID, LID, uverbs and umad.
func wideNode(n int) hcatest.Spec {
	dgx, _ := hcatest.Preset("dgx-h100")
	tmpl := dgx.HCAs[0]
	s := hcatest.Spec{Hostname: nodeName, NetnsShared: true, RDMACMMinor: dgx.RDMACMMinor}
	for i := range n {
		h := tmpl
		h.Name = fmt.Sprintf("mlx5_%d", i)
		h.NodeGUID = fmt.Sprintf("a088:c203:0012:%04x", 0x3a40+0x10*i)
		h.SysImageGUID = h.NodeGUID
		port := tmpl.Ports[0]
		port.LID, port.UMAD = uint16(0x1a+i), i
		port.GIDs = []hcatest.GIDSpec{{Index: 0, GID: "fe80:0000:0000:0000:" + h.NodeGUID, Type: tmpl.Ports[0].GIDs[0].Type}}
		h.Ports = []hcatest.PortSpec{port}
		pci := *tmpl.PCI
		root, bus := 0x10+2*i, 0x11+2*i
		pci.BusID = fmt.Sprintf("0000:%02x:00.0", bus)
		pci.Path = []string{fmt.Sprintf("pci0000:%02x", root), fmt.Sprintf("0000:%02x:01.0", root), pci.BusID}
		h.PCI = &pci
		h.Uverbs = i
		h.Netdevs = []string{fmt.Sprintf("ibp%ds0", bus)}
		s.HCAs = append(s.HCAs, h)
	}
	return s
}

// allocatedClaim makes claim i as the scheduler leaves it: reserved for a
// hostNetwork pod bound to the node, allocated HCA i % hcaCount.
func allocatedClaim(b *testing.B, c kubernetes.Interface, i int) *drapb.Claim {
	b.Helper()
	ctx := context.Background()
	pod, err := c.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%03d", i)},
		Spec: corev1.PodSpec{NodeName: nodeName, HostNetwork: true,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	claim, err := c.ResourceV1().ResourceClaims(namespace).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%03d", i)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "hca", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "hca.rdma.dra.dev"},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "hca", Driver: driverName, Pool: nodeName, Device: fmt.Sprintf("mlx5-%d", i%hcaCount)}},
	}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if claim, err = c.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	return &drapb.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}
}

// register plays the kubelet's plugin watcher on p's registration socket
// (GetInfo, then the status) and dials the plugin socket it names.
func register(b *testing.B, p *cluster.DriverProcess, socket string) drapb.DRAPluginClient {
	b.Helper()
	var info *registerapi.PluginInfo
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if exited, err := p.Exited(); exited {
			return false, fmt.Errorf("the process exited (%v)", err)
		}
		conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return false, nil
		}
		defer conn.Close()
		reg := registerapi.NewRegistrationClient(conn)
		if info, err = reg.GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
			return false, nil
		}
		_, err = reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
		return err == nil, nil
	})
	if err != nil {
		b.Fatalf("registering the plugin at %s: %v\n%s", socket, err, p.Logs())
	}
	return drapb.NewDRAPluginClient(dial(b, info.Endpoint))
}

func dial(b *testing.B, socket string) *grpc.ClientConn {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return conn
}

// waitPublished waits for the node's ResourceSlice with every HCA, so the
// daemon's start-up traffic is over before anything is timed.
func (w *world) waitPublished(b *testing.B) {
	b.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := w.cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n := 0
		for _, s := range list.Items {
			n += len(s.Spec.Devices)
		}
		return n == hcaCount, nil
	})
	if err != nil {
		b.Fatalf("the daemon's ResourceSlice with %d HCAs: %v\n%s", hcaCount, err, w.daemon.Logs())
	}
}

// cycle prepares claim through dra and unprepares it, returning how long
// the prepare took; a claim the driver fails is an error.
func cycle(ctx context.Context, dra drapb.DRAPluginClient, claim *drapb.Claim) (time.Duration, error) {
	start := time.Now()
	resp, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claim}})
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("prepare %s: %w", claim.Name, err)
	}
	r := resp.Claims[claim.Uid]
	if r == nil || r.Error != "" || len(r.Devices) != 1 {
		return 0, fmt.Errorf("prepare %s: %+v", claim.Name, r)
	}
	uresp, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{claim}})
	if err != nil {
		return 0, fmt.Errorf("unprepare %s: %w", claim.Name, err)
	}
	if u := uresp.Claims[claim.Uid]; u == nil || u.Error != "" {
		return 0, fmt.Errorf("unprepare %s: %+v", claim.Name, u)
	}
	return took, nil
}

// loadAvg is the 1-minute load average.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	var one string
	fmt.Sscan(string(data), &one)
	return one
}
