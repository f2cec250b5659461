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
)

const nodeName = "dgx01"

// waitRegistered waits until the driver answers on its registration
// socket: a SIGKILLed predecessor leaves the socket file behind.
func (w *world) waitRegistered(socket string) {
	w.t.Helper()
	w.wait("the driver's registration socket", 30*time.Second, func() (bool, string) {
		conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return false, err.Error()
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
		return err == nil, fmt.Sprint(err)
	})
}

func (w *world) registrationSocket() string {
	return filepath.Join(w.kubeletDir, "plugins_registry", "rdma.dra.dev-reg.sock")
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
func (w *world) register() drapb.DRAPluginClient {
	w.t.Helper()
	return w.registerAt(w.registrationSocket())
}

// registerAt registers the plugin whose registration socket is socket.
func (w *world) registerAt(socket string) drapb.DRAPluginClient {
	w.t.Helper()
	w.waitRegistered(socket)
	reg := registerapi.NewRegistrationClient(dial(w.t, socket))
	info, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		w.t.Fatal(err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != "rdma.dra.dev" {
		w.t.Fatalf("GetInfo = %+v", info)
	}
	if _, err := reg.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		w.t.Fatal(err)
	}
	return drapb.NewDRAPluginClient(dial(w.t, info.Endpoint))
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
	t.Parallel() // no node: see parallel in main_test.go
	w := newBareWorld(t, "-v=2")
	if _, err := w.cp.Client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.startDriver()
	dra := w.register()

	var devices []string
	w.wait("the node's ResourceSlice", 30*time.Second, func() (bool, string) {
		list, err := w.cp.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 {
			return false, fmt.Sprint(err)
		}
		devices = nil
		for _, d := range list.Items[0].Spec.Devices {
			devices = append(devices, d.Name)
		}
		return list.Items[0].Spec.Pool.Name == nodeName, list.Items[0].Spec.Pool.Name
	})
	if got := strings.Join(devices, ","); got != "mlx5-0,mlx5-1,mlx5-2,mlx5-3,mlx5-4,mlx5-5,mlx5-6,mlx5-7,mlx5-8,mlx5-9" {
		t.Errorf("published devices = %s", got)
	}

	claim := allocatedClaim(t, w.cp.Client, "job-0", "mlx5-2")
	ref := &drapb.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}
	resp, err := dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Claims[string(claim.UID)]
	if r.Error != "" || len(r.Devices) != 1 || r.Devices[0].DeviceName != "mlx5-2" {
		t.Fatalf("prepare = %+v", r)
	}
	// The claim's device, then the helper's device-metadata device.
	if want := fmt.Sprintf("rdma.dra.dev/hca=%s-mlx5-2", claim.UID); len(r.Devices[0].CdiDeviceIds) != 2 || r.Devices[0].CdiDeviceIds[0] != want ||
		!strings.HasPrefix(r.Devices[0].CdiDeviceIds[1], "rdma.dra.dev/metadata=") {
		t.Errorf("CDI IDs = %v, want [%s rdma.dra.dev/metadata=...]", r.Devices[0].CdiDeviceIds, want)
	}
	if entries, _ := os.ReadDir(w.cdiDir); len(entries) != 2 {
		t.Errorf("CDI dir after prepare: %v, want the claim's spec and its metadata spec", entries)
	}

	w.proc.Kill()
	if err := w.cp.Client.ResourceV1().ResourceClaims("default").Delete(context.Background(), claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.startDriver()
	dra = w.register()
	// The restarted driver remembers mlx5-2 is prepared: another claim for
	// it is refused (exclusive mode) until the first is unprepared.
	second := allocatedClaim(t, w.cp.Client, "job-1", "mlx5-2")
	sref := &drapb.Claim{Namespace: second.Namespace, Name: second.Name, Uid: string(second.UID)}
	sresp, err := dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{sref}})
	if err != nil {
		t.Fatal(err)
	}
	if e := sresp.Claims[string(second.UID)].Error; !strings.Contains(e, "mlx5-2") {
		t.Errorf("a second claim for mlx5-2 after the restart: error %q, want a refusal naming mlx5-2", e)
	}
	uresp, err := dra.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref}})
	if err != nil {
		t.Fatal(err)
	}
	if e := uresp.Claims[string(claim.UID)].Error; e != "" {
		t.Fatalf("unprepare after SIGKILL: %s", e)
	}
	if entries, _ := os.ReadDir(w.cdiDir); len(entries) != 0 {
		t.Errorf("CDI specs left behind: %v", entries)
	}
	if err := w.proc.Stop(); err != nil {
		t.Errorf("SIGTERM: driver exited with %v\n%s", err, w.proc.Logs())
	}
	w.proc = nil
}
