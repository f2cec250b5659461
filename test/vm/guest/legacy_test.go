package guest

// The legacy routes on the real kernel: a claim on the legacy device (what
// an `rdma/hca: 1` pod gets through extendedResourceName), and the
// device-plugin shim's Allocate, give the container every HCA of the node,
// and each one opens.

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/legacy"
)

func TestLegacyContainerGetsEveryHCA(t *testing.T) {
	inGuest(t)
	skipWithoutRunc(t)
	n := startNode(t, nodeConfig{shares: 1000, legacyShares: 1000})
	c := n.claim("legacy", []string{devices.LegacyDeviceName}, "22222222-aaaa-4aaa-8aaa-000000000001")
	ids := n.prepare(c)
	t.Logf("CDI devices: %v", ids)
	everyHCA(t, "legacy", n.drv.Inventory(), n.cdiDir, ids)
	n.unprepare(c)
}

// everyHCA: a container with the CDI devices ids sees every HCA's uverbs
// node and rdma_cm, and opens each HCA.
func everyHCA(t *testing.T, name string, inv hca.Inventory, cdiDir string, ids []string) {
	t.Helper()
	want := []string{"rdma_cm"}
	for _, dev := range rdmaDevices() {
		want = append(want, uverbsOf(t, inv, dev))
	}
	slices.Sort(want)
	if got := listInfiniband(t, name+"-ls", cdiDir, ids...); !slices.Equal(got, want) {
		t.Errorf("%s container: /dev/infiniband = %v, want %v", name, got, want)
	}
	script := shScript("open-each.sh", rdmaDevices()...)
	r := runContainer(t, name+"-open", withCDI(t, containerSpec(name+"-open", script...), cdiDir, ids...), 30*time.Second)
	if r.exit != 0 {
		t.Errorf("opening every HCA in the %s container: exit %d\n%s", name, r.exit, r.out)
	}
	for _, dev := range rdmaDevices() {
		if !strings.Contains(r.out, "hca_id:\t"+dev) {
			t.Errorf("%s container did not query %s:\n%s", name, dev, r.out)
		}
	}
	t.Logf("%s container:\n%s", name, r.out)
}

// registrar plays the kubelet's device-plugin registration service.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	regs chan *pluginapi.RegisterRequest
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.regs <- req
	return &pluginapi.Empty{}, nil
}

// TestLegacyDevicePluginContainerGetsEveryHCA: the device-plugin shim
// registers rdma/hca with the kubelet (played here), lists its shares,
// and Allocate answers with the node-wide CDI device, which gives the
// container every HCA.
func TestLegacyDevicePluginContainerGetsEveryHCA(t *testing.T) {
	inGuest(t)
	skipWithoutRunc(t)
	dir, err := os.MkdirTemp("/tmp", "dp-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cdiDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(cdiDir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, legacy.KubeletSocketName))
	if err != nil {
		t.Fatal(err)
	}
	reg := &registrar{regs: make(chan *pluginapi.RegisterRequest, 4)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()

	shim, err := legacy.New(legacy.Config{ResourceName: legacy.DefaultResourceName, Shares: 8, DevicePluginDir: dir,
		CDI: cdi.NewSpecDir(cdiDir), EditOptions: cdi.EditOptions{Env: true, HostDevRoot: "/dev"}})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := hca.NewDiscoverer(hca.WithNetlink(hca.HostNetlink("/sys"))).Discover()
	if err != nil {
		t.Fatal(err)
	}
	if err := shim.Update(inv); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() { _ = shim.Run(ctx) }()
	var r *pluginapi.RegisterRequest
	select {
	case r = <-reg.regs:
	case <-ctx.Done():
		t.Fatal("the shim never registered")
	}
	if r.ResourceName != legacy.DefaultResourceName {
		t.Errorf("registered %q", r.ResourceName)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Devices) != 8 || list.Devices[0].Health != pluginapi.Healthy {
		t.Fatalf("ListAndWatch: %v", list.Devices)
	}
	resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{list.Devices[0].ID}}}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range resp.ContainerResponses[0].CdiDevices {
		ids = append(ids, d.Name)
	}
	t.Logf("Allocate: CDI devices %v", ids)
	everyHCA(t, "device-plugin", inv, cdiDir, ids)
}
