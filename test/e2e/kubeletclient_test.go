package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

const nodeName = "dgx01"

// node is a simulated RDMA node with the driver binary pointed at a real
// kube-apiserver; the test plays the kubelet on the driver's sockets.
type node struct {
	t          *testing.T
	cp         *cluster.ControlPlane
	binary     string
	sim        *hcatest.Node
	kubeletDir string
	cdiDir     string
	proc       *cluster.DriverProcess
}

func newNode(t *testing.T) *node {
	t.Helper()
	dir := t.TempDir()
	cp, err := cluster.StartControlPlane(t, filepath.Join(dir, "cp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	binary, err := cluster.BuildDriver(dir)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := hcatest.Preset("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := hcatest.Build(filepath.Join(dir, "node"), spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, cp: cp, binary: binary, sim: sim, kubeletDir: filepath.Join(dir, "kubelet"), cdiDir: filepath.Join(dir, "cdi")}
	t.Cleanup(func() {
		if n.proc != nil {
			n.proc.Kill()
		}
		if t.Failed() && n.proc != nil {
			t.Logf("driver logs:\n%s", n.proc.Logs())
		}
	})
	return n
}

func (n *node) startDriver() {
	n.t.Helper()
	p, err := cluster.StartDriver(n.binary,
		"--node-name="+nodeName, "--kubeconfig="+n.cp.Kubeconfig,
		"--sysfs-root="+n.sim.SysfsRoot, "--dev-root="+n.sim.DevRoot, "--cdi-root="+n.cdiDir,
		"--kubelet-root-dir="+n.kubeletDir, "--metrics-address=127.0.0.1:0", "--healthz-address=127.0.0.1:0", "-v=2")
	if err != nil {
		n.t.Fatal(err)
	}
	n.proc = p
	// A SIGKILLed predecessor leaves its socket file: wait for an answer.
	n.waitFor("the driver's registration socket", func() bool {
		conn, err := grpc.NewClient("unix://"+n.registrationSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return false
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
		return err == nil
	})
}

func (n *node) registrationSocket() string {
	return filepath.Join(n.kubeletDir, "plugins_registry", "rdma.dra.dev-reg.sock")
}

func (n *node) waitFor(what string, cond func() bool) {
	n.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if exited, err := n.proc.Exited(); exited {
			n.t.Fatalf("driver exited (%v) while waiting for %s:\n%s", err, what, n.proc.Logs())
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func dial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// register plays the kubelet's plugin watcher: GetInfo, then a status.
func (n *node) register() drapb.DRAPluginClient {
	n.t.Helper()
	reg := registerapi.NewRegistrationClient(dial(n.t, n.registrationSocket()))
	info, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		n.t.Fatal(err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != "rdma.dra.dev" {
		n.t.Fatalf("GetInfo = %+v", info)
	}
	if _, err := reg.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		n.t.Fatal(err)
	}
	return drapb.NewDRAPluginClient(dial(n.t, info.Endpoint))
}

// allocatedClaim creates a pod and a claim allocated to one device, as the
// scheduler would leave them.
func allocatedClaim(t *testing.T, c kubernetes.Interface, name, device string) *resourceapi.ResourceClaim {
	t.Helper()
	ctx := context.Background()
	pod, err := c.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{NodeName: nodeName, HostNetwork: true,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim, err := c.ResourceV1().ResourceClaims("default").Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "hca", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "hca.rdma.dra.dev"},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "hca", Driver: "rdma.dra.dev", Pool: nodeName, Device: device}},
	}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	claim, err = c.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return claim
}

// TestKubeletClientAcrossSIGKILL: register the plugin, see the node's
// ResourceSlice in the API server, prepare a claim, SIGKILL the driver,
// delete the claim, restart the driver and unprepare: no CDI spec remains.
func TestKubeletClientAcrossSIGKILL(t *testing.T) {
	n := newNode(t)
	n.startDriver()
	dra := n.register()

	var devices []string
	n.waitFor("the node's ResourceSlice", func() bool {
		list, err := n.cp.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 {
			return false
		}
		devices = nil
		for _, d := range list.Items[0].Spec.Devices {
			devices = append(devices, d.Name)
		}
		return list.Items[0].Spec.Pool.Name == nodeName
	})
	if got := strings.Join(devices, ","); got != "mlx5-0,mlx5-1,mlx5-2,mlx5-3,mlx5-4,mlx5-5,mlx5-6,mlx5-7,mlx5-8,mlx5-9" {
		t.Errorf("published devices = %s", got)
	}

	claim := allocatedClaim(t, n.cp.Client, "job-0", "mlx5-2")
	ref := &drapb.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}
	resp, err := dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Claims[string(claim.UID)]
	if r.Error != "" || len(r.Devices) != 1 || r.Devices[0].DeviceName != "mlx5-2" {
		t.Fatalf("prepare = %+v", r)
	}
	if want := fmt.Sprintf("rdma.dra.dev/hca=%s-mlx5-2", claim.UID); len(r.Devices[0].CdiDeviceIds) != 1 || r.Devices[0].CdiDeviceIds[0] != want {
		t.Errorf("CDI IDs = %v, want [%s]", r.Devices[0].CdiDeviceIds, want)
	}
	if entries, _ := os.ReadDir(n.cdiDir); len(entries) != 1 {
		t.Errorf("CDI dir after prepare: %v", entries)
	}

	n.proc.Kill()
	if err := n.cp.Client.ResourceV1().ResourceClaims("default").Delete(context.Background(), claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n.startDriver()
	dra = n.register()
	uresp, err := dra.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref}})
	if err != nil {
		t.Fatal(err)
	}
	if e := uresp.Claims[string(claim.UID)].Error; e != "" {
		t.Fatalf("unprepare after SIGKILL: %s", e)
	}
	if entries, _ := os.ReadDir(n.cdiDir); len(entries) != 0 {
		t.Errorf("CDI specs left behind: %v", entries)
	}
	if err := n.proc.Stop(); err != nil {
		t.Errorf("SIGTERM: driver exited with %v\n%s", err, n.proc.Logs())
	}
	n.proc = nil
}
