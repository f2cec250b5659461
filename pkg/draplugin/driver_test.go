package draplugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kwait "k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi/cditest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

const (
	driverName = "rdma.dra.dev"
	nodeName   = "dgx01"
	bootA      = "0f3b2c4d-1111-4a5b-8c9d-0123456789ab"
	bootB      = "7e6d5c4b-2222-4a5b-8c9d-ba9876543210"
)

// env is one node: a simulated dgx-h100, a fake API server and the driver
// serving its real sockets. newEnv sets the defaults; a test changes cfg
// and deps before start.
type env struct {
	t      testing.TB
	node   *hcatest.Node
	client *fake.Clientset
	envDirs
	bootID string
	cfg    draplugin.Config // the driver's settings
	deps   envDeps
	*running
}

// envDirs are where the node keeps its files.
type envDirs struct {
	cdiDir, stateDir, pluginDir, registryDir string
}

// envDeps are the driver's collaborators and the helper's options beyond
// the defaults.
type envDeps struct {
	storeOpts []checkpoint.Option
	hostRDMA  draplugin.HostRDMA
	hostLinks draplugin.HostLinks // the moveNetdev check's; the Node's InternalIPs come from client
	metrics   *draplugin.Metrics
	// claimStatus has the driver write claims' status.devices.
	claimStatus bool
	helperOpts  []kubeletplugin.Option
	// pods and specs, if set, wrap the pod lookup and the CDI spec
	// directory (to watch or hold them).
	pods  func(draplugin.PodGetter) draplugin.PodGetter
	specs func(draplugin.CDISpecs) draplugin.CDISpecs
}

// running is a started driver instance.
type running struct {
	drv    *draplugin.Driver
	helper *kubeletplugin.Helper
	cancel context.CancelFunc
	conn   *grpc.ClientConn
	dra    drapb.DRAPluginClient
}

func newEnv(t testing.TB) *env {
	t.Helper()
	spec, err := hcatest.Preset("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	node, err := hcatest.Build(filepath.Join(dir, "node"), spec)
	if err != nil {
		t.Fatal(err)
	}
	// The sockets' directories: a unix socket's path has at most 107
	// bytes, and t.TempDir's holds the test's name.
	sockets, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockets) })
	e := &env{
		t:      t,
		node:   node,
		client: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-uid"}}),
		envDirs: envDirs{
			cdiDir:      filepath.Join(dir, "cdi"),
			stateDir:    filepath.Join(dir, "state"),
			pluginDir:   filepath.Join(sockets, "plugins", driverName),
			registryDir: filepath.Join(sockets, "plugins_registry"),
		},
		bootID: bootA,
		cfg: draplugin.Config{
			DriverName: driverName, NodeName: nodeName, HostDevRoot: node.DevRoot,
			RescanInterval: time.Hour, TaintUnhealthy: true,
		},
	}
	for _, d := range []string{e.cdiDir, e.stateDir, e.pluginDir, e.registryDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(e.stop)
	return e
}

// withLimits publishes the RDMA cgroup capacities (shared mode), enforced
// by the hook at hook.
func (e *env) withLimits(hook string) {
	e.cfg.HookPath = hook
	e.cfg.Limits.Handles, e.cfg.Limits.Objects = 64, 4096
}

type podGetter struct{ client *fake.Clientset }

func (p podGetter) GetPod(ctx context.Context, ns, name string, _ types.UID) (*corev1.Pod, error) {
	return p.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

func (e *env) checkpointPath() string { return filepath.Join(e.stateDir, "checkpoint.json") }

// start runs a driver instance on the env's directories, with the helper
// as the daemon starts it (calls not serialized).
func (e *env) start() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	drv, err := e.newDriver(ctx)
	if err != nil {
		cancel()
		e.t.Fatalf("starting the driver: %v", err)
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(driverName), kubeletplugin.NodeName(nodeName), kubeletplugin.KubeClient(e.client),
		kubeletplugin.PluginDataDirectoryPath(e.pluginDir), kubeletplugin.RegistrarDirectoryPath(e.registryDir),
		kubeletplugin.Serialize(false),
	}
	helper, err := kubeletplugin.Start(ctx, drv, append(opts, e.deps.helperOpts...)...)
	if err != nil {
		cancel()
		e.t.Fatalf("starting the helper: %v", err)
	}
	if err := drv.SetPublisher(ctx, helper); err != nil {
		e.t.Fatal(err)
	}
	go drv.Run(ctx)
	conn, err := grpc.NewClient("unix://"+filepath.Join(e.pluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.running = &running{drv: drv, helper: helper, cancel: cancel, conn: conn, dra: drapb.NewDRAPluginClient(conn)}
}

// newDriver builds a driver on the env's directories and settings, as
// start does, without the helper: a second daemon of a rolling update.
func (e *env) newDriver(ctx context.Context) (*draplugin.Driver, error) {
	var pods draplugin.PodGetter = podGetter{e.client}
	if e.deps.pods != nil {
		pods = e.deps.pods(pods)
	}
	var specs draplugin.CDISpecs = cdi.NewSpecDir(e.cdiDir)
	if e.deps.specs != nil {
		specs = e.deps.specs(specs)
	}
	cfg := e.cfg
	cfg.PluginDataDir = e.pluginDir
	return draplugin.New(ctx, cfg, draplugin.Deps{
		HostRDMA:   e.deps.hostRDMA,
		HostLinks:  e.deps.hostLinks,
		NodeIPs:    draplugin.NodeGetter{Nodes: e.client.CoreV1().Nodes(), Name: nodeName},
		Metrics:    e.deps.metrics,
		HCAs:       hca.NewDiscoverer(hca.WithSysfsRoot(e.node.SysfsRoot), hca.WithDevRoot(e.node.DevRoot), hca.WithReadFile(e.node.ReadFile)),
		Pods:       pods,
		SpecDir:    specs,
		Checkpoint: checkpoint.NewStore(e.checkpointPath(), e.deps.storeOpts...),
		BootID:     e.bootID,
		Claims:     e.claims(),
	})
}

// stop ends the instance the way a SIGKILL would leave the disk: nothing
// is flushed beyond what each call already made durable.
func (e *env) stop() {
	if e.running == nil {
		return
	}
	e.conn.Close()
	e.helper.Stop()
	e.cancel()
	e.running = nil
}

func hostNetworkPod(name string, hostNetwork bool) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("pod-" + name)},
		Spec:       corev1.PodSpec{NodeName: nodeName, HostNetwork: hostNetwork},
	}
}

type allocated struct {
	request, device string
	admin           bool
	share           string
}

// claim creates an allocated claim reserved for pod, with optional opaque
// configs (JSON) from the claim.
func (e *env) claim(name string, pod *corev1.Pod, devices []allocated, configs ...string) *resourceapi.ResourceClaim {
	e.t.Helper()
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
	}
	alloc := &resourceapi.AllocationResult{}
	for _, d := range devices {
		r := resourceapi.DeviceRequestAllocationResult{Request: d.request, Driver: driverName, Pool: nodeName, Device: d.device}
		if d.admin {
			r.AdminAccess = new(bool)
			*r.AdminAccess = true
		}
		if d.share != "" {
			id := types.UID(d.share)
			r.ShareID = &id
		}
		alloc.Devices.Results = append(alloc.Devices.Results, r)
	}
	for _, cfg := range configs {
		alloc.Devices.Config = append(alloc.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(cfg)},
			}},
		})
	}
	c.Status.Allocation = alloc
	if pod != nil {
		if _, err := e.client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{}); err != nil {
			if _, err := e.client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
				e.t.Fatal(err)
			}
		}
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	}
	if _, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return c
}

func one(device string) []allocated { return []allocated{{request: "hca", device: device}} }

func ref(c *resourceapi.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

// prepare calls NodePrepareResources over the socket and returns each
// claim's CDI IDs or error.
func (e *env) prepare(claims ...*resourceapi.ResourceClaim) map[string]*drapb.NodePrepareResourceResponse {
	e.t.Helper()
	req := &drapb.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, ref(c))
	}
	resp, err := e.dra.NodePrepareResources(context.Background(), req)
	if err != nil {
		e.t.Fatalf("NodePrepareResources: %v", err)
	}
	return resp.Claims
}

func (e *env) mustPrepare(c *resourceapi.ResourceClaim) []string {
	e.t.Helper()
	r := e.prepare(c)[string(c.UID)]
	if r.Error != "" {
		e.t.Fatalf("preparing %s: %s", c.Name, r.Error)
	}
	var ids []string
	for _, d := range r.Devices {
		ids = append(ids, d.CdiDeviceIds...)
	}
	return ids
}

func (e *env) unprepare(claims ...*drapb.Claim) map[string]*drapb.NodeUnprepareResourceResponse {
	e.t.Helper()
	resp, err := e.dra.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: claims})
	if err != nil {
		e.t.Fatalf("NodeUnprepareResources: %v", err)
	}
	return resp.Claims
}

// container injects CDI devices into an OCI spec with the CDI library, as
// containerd does, reading the spec files from disk.
func (e *env) container(ids ...string) *oci.Spec {
	e.t.Helper()
	return cditest.Inject(e.t, e.cdiDir, ids...)
}

func devicesOf(s *oci.Spec) []string {
	var out []string
	for _, d := range s.Linux.Devices {
		out = append(out, fmt.Sprintf("%s %s %d:%d", d.Path, d.Type, d.Major, d.Minor))
	}
	slices.Sort(out)
	return out
}

func envOf(s *oci.Spec, prefix ...string) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		for _, p := range prefix {
			if strings.HasPrefix(k, p) {
				out[k] = v
			}
		}
	}
	return out
}

var hintVars = []string{"RDMA_", "NCCL_", "UCX_"}

func TestRegistrationAndPublishedSlice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	conn, err := grpc.NewClient("unix://"+filepath.Join(e.registryDir, driverName+"-reg.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reg := registerapi.NewRegistrationClient(conn)
	info, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != driverName || info.Endpoint != filepath.Join(e.pluginDir, "dra.sock") {
		t.Errorf("GetInfo = %+v", info)
	}
	if _, err := reg.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if st := e.helper.RegistrationStatus(); st == nil || !st.PluginRegistered {
		t.Errorf("helper registration status = %v", st)
	}

	sl := waitForSlices(t, e)
	if len(sl) != 1 {
		t.Fatalf("got %d ResourceSlices, want 1", len(sl))
	}
	s := sl[0].Spec
	var names []string
	for _, d := range s.Devices {
		names = append(names, d.Name)
	}
	want := []string{"mlx5-0", "mlx5-1", "mlx5-2", "mlx5-3", "mlx5-4", "mlx5-5", "mlx5-6", "mlx5-7", "mlx5-8", "mlx5-9"}
	if s.Driver != driverName || s.NodeName == nil || *s.NodeName != nodeName || s.Pool.Name != nodeName || !slices.Equal(names, want) {
		t.Errorf("slice driver=%s node=%v pool=%s devices=%v", s.Driver, s.NodeName, s.Pool.Name, names)
	}
}

func TestPrepareExposesOnlyTheClaimsHCA(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	c := e.claim("one", hostNetworkPod("p1", true), one("mlx5-3"))
	ids := e.mustPrepare(c)
	if want := []string{"rdma.dra.dev/hca=uid-one-mlx5-3"}; !slices.Equal(ids, want) {
		t.Fatalf("CDI IDs = %v, want %v", ids, want)
	}
	s := e.container(ids...)
	wantDevs := []string{"/dev/infiniband/rdma_cm c 10:58", "/dev/infiniband/uverbs3 c 231:195"}
	if got := devicesOf(s); !slices.Equal(got, wantDevs) {
		t.Errorf("container devices = %v, want %v", got, wantDevs)
	}
	wantEnv := map[string]string{
		"RDMA_DEVICES":       "mlx5_3",
		"RDMA_DEVICE_MLX5_3": "/dev/infiniband/uverbs3",
		"NCCL_IB_HCA":        "=mlx5_3",
		"UCX_NET_DEVICES":    "mlx5_3:1",
	}
	if diff := cmp.Diff(wantEnv, envOf(s, hintVars...)); diff != "" {
		t.Errorf("container env (-want +got):\n%s", diff)
	}
	for _, d := range s.Linux.Devices {
		if d.Path == "/dev/infiniband/uverbs3" {
			host := filepath.Join(e.node.DevRoot, "infiniband", "uverbs3")
			if _, err := os.Stat(host); err != nil {
				t.Errorf("host node %s: %v", host, err)
			}
		}
	}
}

func TestPrepareIsIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.deps.metrics = draplugin.NewMetrics()
	e.start()
	c := e.claim("idem", hostNetworkPod("p1", true), one("mlx5-0"))
	first := e.mustPrepare(c)
	if v := metricValue(t, e.deps.metrics, "rdma_dra_prepare_repeated_claims_total", "", ""); v != 0 {
		t.Errorf("after the first prepare, prepare_repeated_claims_total = %v, want 0", v)
	}
	spec := filepath.Join(e.cdiDir, cdiapi.GenerateTransientSpecName(cdi.Vendor, cdi.Class, string(c.UID))+".json")
	before, err := os.ReadFile(spec)
	if err != nil {
		t.Fatalf("spec file: %v", err)
	}
	if err := os.Remove(spec); err != nil { // as if /var/run/cdi were emptied
		t.Fatal(err)
	}
	second := e.mustPrepare(c)
	if !slices.Equal(first, second) {
		t.Errorf("second prepare = %v, first %v", second, first)
	}
	if v := metricValue(t, e.deps.metrics, "rdma_dra_prepare_repeated_claims_total", "", ""); v != 1 {
		t.Errorf("after the kubelet asked again, prepare_repeated_claims_total = %v, want 1", v)
	}
	after, err := os.ReadFile(spec)
	if err != nil {
		t.Fatalf("prepare did not rewrite the missing spec: %v", err)
	}
	if string(before) != string(after) {
		t.Errorf("rewritten spec differs:\n%s\n---\n%s", before, after)
	}
	uids, _ := cdi.NewSpecDir(e.cdiDir).ClaimUIDs()
	if !slices.Equal(uids, []string{string(c.UID)}) {
		t.Errorf("spec files for claims %v, want just %s", uids, c.UID)
	}
}

func TestDoubleAllocationRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	a := e.claim("a", hostNetworkPod("pa", true), one("mlx5-1"))
	e.mustPrepare(a)
	b := e.claim("b", hostNetworkPod("pb", true), one("mlx5-1"))
	r := e.prepare(b)[string(b.UID)]
	if !strings.Contains(r.Error, "device mlx5-1 (mlx5_1) is already prepared for claim default/a") {
		t.Errorf("second claim on mlx5-1: error %q", r.Error)
	}
	if uids, _ := cdi.NewSpecDir(e.cdiDir).ClaimUIDs(); slices.Contains(uids, string(b.UID)) {
		t.Error("the refused claim got a CDI spec")
	}
	// Two admin-access claims may watch the same HCA.
	x := e.claim("x", hostNetworkPod("px", true), []allocated{{request: "hca", device: "mlx5-2", admin: true}})
	y := e.claim("y", hostNetworkPod("py", true), []allocated{{request: "hca", device: "mlx5-2", admin: true}})
	e.mustPrepare(x)
	e.mustPrepare(y)
	// After unprepare, the HCA is free again.
	e.unprepare(ref(a))
	e.mustPrepare(b)
}

func TestOpaqueConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		config    string
		fromClass bool // an admin-only field: the DeviceClass's to grant (policy_test.go)
		wantErr   string
		wantDevs  []string
		wantEnv   map[string]string
	}{
		{
			name:    "typo in a field",
			config:  `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","managmentDevices":true}`,
			wantErr: `unknown field "managmentDevices"`,
		},
		{
			name:    "wrong kind",
			config:  `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"GpuConfig"}`,
			wantErr: `kind: want "HcaConfig", got "GpuConfig"`,
		},
		{
			name:      "management devices",
			config:    `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","managementDevices":true}`,
			fromClass: true,
			wantDevs:  []string{"/dev/infiniband/issm0 c 231:64", "/dev/infiniband/rdma_cm c 10:58", "/dev/infiniband/umad0 c 231:0", "/dev/infiniband/uverbs0 c 231:192"},
			wantEnv:   map[string]string{"RDMA_DEVICES": "mlx5_0", "RDMA_DEVICE_MLX5_0": "/dev/infiniband/uverbs0", "NCCL_IB_HCA": "=mlx5_0", "UCX_NET_DEVICES": "mlx5_0:1"},
		},
		{
			name:     "no env",
			config:   `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","env":false}`,
			wantDevs: []string{"/dev/infiniband/rdma_cm c 10:58", "/dev/infiniband/uverbs0 c 231:192"},
			wantEnv:  map[string]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.start()
			var c *resourceapi.ResourceClaim
			if tt.fromClass {
				c = e.withClass(e.claim("cfg", hostNetworkPod("p", true), one("mlx5-0")), "ib.rdma.dra.dev", tt.config)
			} else {
				c = e.claim("cfg", hostNetworkPod("p", true), one("mlx5-0"), tt.config)
			}
			r := e.prepare(c)[string(c.UID)]
			if tt.wantErr != "" {
				if !strings.Contains(r.Error, tt.wantErr) || !strings.Contains(r.Error, "config[0]") {
					t.Fatalf("error %q, want one naming config[0] and containing %q", r.Error, tt.wantErr)
				}
				return
			}
			if r.Error != "" {
				t.Fatal(r.Error)
			}
			s := e.container(r.Devices[0].CdiDeviceIds...)
			if got := devicesOf(s); !slices.Equal(got, tt.wantDevs) {
				t.Errorf("devices = %v, want %v", got, tt.wantDevs)
			}
			if diff := cmp.Diff(tt.wantEnv, envOf(s, hintVars...)); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHostNetworkPolicy(t *testing.T) {
	t.Parallel()
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.cfg.AllowNonHostNetwork = allow
			e.start()
			c := e.claim("podnet", hostNetworkPod("podnet", false), one("mlx5-0"))
			r := e.prepare(c)[string(c.UID)]
			if allow {
				if r.Error != "" {
					t.Errorf("allowed non-hostNetwork pod refused: %s", r.Error)
				}
				return
			}
			for _, want := range []string{"pod default/podnet does not use hostNetwork", "--allow-non-host-network", "allowNonHostNetwork"} {
				if !strings.Contains(r.Error, want) {
					t.Errorf("error %q does not contain %q", r.Error, want)
				}
			}
			if uids, _ := cdi.NewSpecDir(e.cdiDir).ClaimUIDs(); len(uids) != 0 {
				t.Errorf("refused claim left CDI specs %v", uids)
			}
			hn := e.claim("hostnet", hostNetworkPod("hostnet", true), one("mlx5-1"))
			e.mustPrepare(hn)
		})
	}
}

func TestVanishedDevice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	if err := e.node.RemoveHCA("mlx5_5"); err != nil {
		t.Fatal(err)
	}
	if err := e.drv.Rescan(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := e.claim("gone", hostNetworkPod("p", true), one("mlx5-5"))
	r := e.prepare(c)[string(c.UID)]
	if !strings.Contains(r.Error, "device mlx5-5 is no longer on node dgx01") {
		t.Errorf("error %q", r.Error)
	}
	unknown := e.claim("unknown", hostNetworkPod("p2", true), one("mlx5-42"))
	if r := e.prepare(unknown)[string(unknown.UID)]; !strings.Contains(r.Error, "mlx5-42") {
		t.Errorf("error %q does not name the device", r.Error)
	}
}

// TestTwoClaimsOneContainer: a container with two claims sees both HCAs in
// every aggregate variable, whichever CDI device the runtime applies last.
func TestTwoClaimsOneContainer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	pod := hostNetworkPod("both", true)
	a := e.claim("a", pod, one("mlx5-0"))
	b := e.claim("b", pod, one("mlx5-7"))
	resp := e.prepare(a, b)
	var ids []string
	for _, c := range []*resourceapi.ResourceClaim{b, a} {
		r := resp[string(c.UID)]
		if r.Error != "" {
			t.Fatal(r.Error)
		}
		ids = append(ids, r.Devices[0].CdiDeviceIds...)
	}
	for _, order := range [][]string{ids, {ids[1], ids[0]}} {
		s := e.container(order...)
		want := map[string]string{
			"RDMA_DEVICES": "mlx5_0,mlx5_7", "NCCL_IB_HCA": "=mlx5_0,mlx5_7", "UCX_NET_DEVICES": "mlx5_0:1,mlx5_7:1",
			"RDMA_DEVICE_MLX5_0": "/dev/infiniband/uverbs0", "RDMA_DEVICE_MLX5_7": "/dev/infiniband/uverbs7",
		}
		if diff := cmp.Diff(want, envOf(s, hintVars...)); diff != "" {
			t.Errorf("env with order %v (-want +got):\n%s", order, diff)
		}
		wantDevs := []string{"/dev/infiniband/rdma_cm c 10:58", "/dev/infiniband/uverbs0 c 231:192", "/dev/infiniband/uverbs7 c 231:199"}
		if got := devicesOf(s); !slices.Equal(got, wantDevs) {
			t.Errorf("devices = %v, want %v", got, wantDevs)
		}
	}
}

// TestRestartUnpreparesDeletedClaim: a new driver on the same directories
// unprepares a claim the old one prepared, after the claim was deleted.
func TestRestartUnpreparesDeletedClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	c := e.claim("r", hostNetworkPod("p", true), one("mlx5-4"))
	e.mustPrepare(c)
	e.stop()
	if err := e.client.ResourceV1().ResourceClaims("default").Delete(context.Background(), c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.start()
	if r := e.unprepare(ref(c))[string(c.UID)]; r.Error != "" {
		t.Fatalf("unprepare after restart: %s", r.Error)
	}
	if entries, _ := os.ReadDir(e.cdiDir); len(entries) != 0 {
		t.Errorf("CDI dir not empty after unprepare: %v", entries)
	}
	cp, err := checkpoint.NewStore(e.checkpointPath()).Load()
	if err != nil || len(cp.Claims) != 0 {
		t.Errorf("checkpoint after unprepare: %v claims, err %v", len(cp.Claims), err)
	}
	// Unknown claims are success: the kubelet retries.
	if r := e.unprepare(ref(c))[string(c.UID)]; r.Error != "" {
		t.Errorf("second unprepare: %s", r.Error)
	}
}

// TestStaleSpecRemovedAtStart: a spec of a claim the checkpoint does not
// know (a crash between the spec and the checkpoint) is removed once it is
// a minute old; a younger one may be a prepare in flight in the other
// daemon of a rolling update, and stays.
func TestStaleSpecRemovedAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stale := cdi.NewSpecDir(e.cdiDir)
	for _, uid := range []string{"uid-stale", "uid-in-flight"} {
		if err := stale.WriteClaim(uid, cdi.CommonEdits(nil, nil, cdi.EditOptions{}),
			[]cdi.ClaimDevice{{Name: cdi.DeviceName(uid, "mlx5-0", ""), Edits: mustEdits(t, e, "mlx5_0")}}); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(stale.Path("uid-stale"), old, old); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(e.cdiDir, "vendor.example-gpu.json")
	if err := os.WriteFile(foreign, []byte(`{"cdiVersion":"0.6.0","kind":"vendor.example/gpu","devices":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	e.start()
	if uids, _ := stale.ClaimUIDs(); !slices.Equal(uids, []string{"uid-in-flight"}) {
		t.Errorf("specs after start: %v, want only the young uid-in-flight", uids)
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Errorf("another vendor's spec was touched: %v", err)
	}
}

func mustEdits(t *testing.T, e *env, ibdev string) cdispec.ContainerEdits {
	t.Helper()
	inv, err := hca.Discover(hca.WithSysfsRoot(e.node.SysfsRoot), hca.WithDevRoot(e.node.DevRoot))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range inv.HCAs {
		if h.Name == ibdev {
			ed, err := cdi.DeviceEdits(h, cdi.EditOptions{HostDevRoot: e.node.DevRoot})
			if err != nil {
				t.Fatal(err)
			}
			return ed
		}
	}
	t.Fatalf("no %s", ibdev)
	return cdispec.ContainerEdits{}
}

// TestCorruptCheckpoint: the corrupt file is moved aside and the driver
// starts empty, but the CDI specs already written stay (a running pod may
// restart a container with them) until the kubelet unprepares the claim.
func TestCorruptCheckpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	running := e.claim("running", hostNetworkPod("r", true), one("mlx5-4"))
	ids := e.mustPrepare(running)
	e.stop()
	if err := os.WriteFile(e.checkpointPath(), []byte(`{"version":1,"checksum":"00","data":{"cla`), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(cdi.NewSpecDir(e.cdiDir).Path(string(running.UID)), old, old); err != nil {
		t.Fatal(err)
	}
	e.start()
	if got := devicesOf(e.container(ids...)); !slices.Contains(got, "/dev/infiniband/uverbs4 c 231:196") {
		t.Errorf("after the corrupt checkpoint the running claim's spec is gone: devices %v", got)
	}
	if r := e.unprepare(ref(running))[string(running.UID)]; r.Error != "" {
		t.Fatalf("unprepare: %s", r.Error)
	}
	if uids, _ := cdi.NewSpecDir(e.cdiDir).ClaimUIDs(); len(uids) != 0 {
		t.Errorf("specs after unprepare: %v", uids)
	}
	matches, _ := filepath.Glob(e.checkpointPath() + ".corrupt-*")
	if len(matches) != 1 {
		t.Fatalf("corrupt checkpoint not moved aside: %v", matches)
	}
	if b, _ := os.ReadFile(matches[0]); !strings.Contains(string(b), `"cla`) {
		t.Errorf("quarantined file lost its content: %q", b)
	}
	c := e.claim("fresh", hostNetworkPod("p", true), one("mlx5-0"))
	e.mustPrepare(c)
}

// TestOlderReleaseCheckpoint: a checkpoint written by an older release
// (fewer fields) still lets the driver unprepare its claim.
func TestOlderReleaseCheckpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b, err := os.ReadFile("../checkpoint/testdata/checkpoint-v1-older-release.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.checkpointPath(), b, 0o600); err != nil {
		t.Fatal(err)
	}
	old, err := checkpoint.NewStore(e.checkpointPath()).Load()
	if err != nil || len(old.Claims) == 0 {
		t.Fatalf("fixture: %d claims, %v", len(old.Claims), err)
	}
	e.start()
	for uid, c := range old.Claims {
		if r := e.unprepare(&drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: uid})[uid]; r.Error != "" {
			t.Errorf("unprepare %s: %s", uid, r.Error)
		}
	}
	cp, err := checkpoint.NewStore(e.checkpointPath()).Load()
	if err != nil || len(cp.Claims) != 0 {
		t.Errorf("after unprepare: %d claims, %v", len(cp.Claims), err)
	}
}

func shared(device, share string) []allocated {
	return []allocated{{request: "hca", device: device, share: share}}
}

// TestSharedMode: many claims share an HCA, each with its own share ID in
// its CDI device name; a claim without a share (exclusive use) of an HCA
// that is handed out shared is refused.
func TestSharedMode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.cfg.Shares = 1000
	e.start()
	a := e.claim("a", hostNetworkPod("pa", true), shared("mlx5-0", "11111111-aaaa-4aaa-8aaa-000000000001"))
	b := e.claim("b", hostNetworkPod("pb", true), shared("mlx5-0", "11111111-aaaa-4aaa-8aaa-000000000002"))
	idsA, idsB := e.mustPrepare(a), e.mustPrepare(b)
	if want := "rdma.dra.dev/hca=uid-a-mlx5-0-11111111-aaaa-4aaa-8aaa-000000000001"; len(idsA) != 1 || idsA[0] != want {
		t.Errorf("shared claim a: CDI IDs %v, want [%s]", idsA, want)
	}
	for _, ids := range [][]string{idsA, idsB} {
		if got := devicesOf(e.container(ids...)); !slices.Contains(got, "/dev/infiniband/uverbs0 c 231:192") {
			t.Errorf("shared claim does not see uverbs0: %v", got)
		}
	}
	x := e.claim("x", hostNetworkPod("px", true), one("mlx5-0"))
	if r := e.prepare(x)[string(x.UID)]; !strings.Contains(r.Error, "already prepared for claim default/a") {
		t.Errorf("exclusive claim on a shared HCA: error %q", r.Error)
	}
}

// TestLegacyDevice: rdma/hca through extendedResourceName lands on the
// legacy device, whose container sees every HCA and rdma_cm; it shares the
// HCAs with per-HCA shared claims.
func TestLegacyDevice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.cfg.Shares, e.cfg.LegacyShares = 1000, 1000
	e.start()
	l1 := e.claim("legacy-1", hostNetworkPod("l1", true), shared("legacy-rdma-hca", "22222222-aaaa-4aaa-8aaa-000000000001"))
	l2 := e.claim("legacy-2", hostNetworkPod("l2", true), shared("legacy-rdma-hca", "22222222-aaaa-4aaa-8aaa-000000000002"))
	per := e.claim("per-hca", hostNetworkPod("p", true), shared("mlx5-3", "22222222-aaaa-4aaa-8aaa-000000000003"))
	ids := e.mustPrepare(l1)
	e.mustPrepare(l2)
	e.mustPrepare(per)
	s := e.container(ids...)
	want := []string{"/dev/infiniband/rdma_cm c 10:58"}
	for i := range 10 {
		want = append(want, fmt.Sprintf("/dev/infiniband/uverbs%d c 231:%d", i, 192+i))
	}
	slices.Sort(want)
	if got := devicesOf(s); !slices.Equal(got, want) {
		t.Errorf("legacy container devices:\n got %v\nwant %v", got, want)
	}
	env := envOf(s, "RDMA_DEVICES", "NCCL_IB_HCA")
	if env["RDMA_DEVICES"] != "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7,mlx5_8,mlx5_9" || !strings.HasPrefix(env["NCCL_IB_HCA"], "=mlx5_0,") {
		t.Errorf("legacy env = %v", env)
	}

	// An HCA hot-removed: the prepared legacy claim's spec follows, so a
	// restarted container does not fail on a missing uverbs9.
	if err := e.node.RemoveHCA("mlx5_9"); err != nil {
		t.Fatal(err)
	}
	if err := e.drv.Rescan(context.Background()); err != nil {
		t.Fatal(err)
	}
	s = e.container(ids...)
	if got := devicesOf(s); !slices.Equal(got, want[:len(want)-1]) || slices.Contains(got, "/dev/infiniband/uverbs9 c 231:201") {
		t.Errorf("legacy container devices after removing mlx5_9:\n got %v\nwant %v", got, want[:len(want)-1])
	}
	if got := envOf(s, "RDMA_DEVICES")["RDMA_DEVICES"]; got != "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7,mlx5_8" {
		t.Errorf("RDMA_DEVICES after removing mlx5_9 = %q", got)
	}

	// All of them gone: the spec still loads, with rdma_cm only.
	for i := range 9 {
		if err := e.node.RemoveHCA(fmt.Sprintf("mlx5_%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.drv.Rescan(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := devicesOf(e.container(ids...)); !slices.Equal(got, []string{"/dev/infiniband/rdma_cm c 10:58"}) {
		t.Errorf("legacy container devices with no HCA left: %v, want rdma_cm only", got)
	}
}

// The GID hints depend on whose GID table the pod uses: a hostNetwork pod's
// is the host's, so it gets the host's index; a pod on its own network gets
// the family instead, for NCCL to find its own address's GID.
func TestGIDHintsFollowThePodNetwork(t *testing.T) {
	t.Parallel()
	ipv6 := `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","addressFamily":"IPv6"}`
	tests := []struct {
		name        string // short: the test's socket paths contain it
		hostNetwork bool
		config      []string
		want        map[string]string
	}{
		{"host", true, nil,
			map[string]string{"NCCL_IB_GID_INDEX": "3", "UCX_IB_GID_INDEX": "3"}},
		{"host-v6-none", true, []string{ipv6},
			map[string]string{}},
		{"pod", false, nil,
			map[string]string{"NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_IB_ROCE_VERSION_NUM": "2"}},
		{"pod-v6", false, []string{ipv6},
			map[string]string{"NCCL_IB_ADDR_FAMILY": "AF_INET6", "NCCL_IB_ROCE_VERSION_NUM": "2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.cfg.AllowNonHostNetwork = true
			e.start()
			c := e.claim("roce", hostNetworkPod("p", tt.hostNetwork), one("mlx5-8"), tt.config...)
			s := e.container(e.mustPrepare(c)...)
			got := envOf(s, "NCCL_IB_GID_INDEX", "UCX_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ROCE_VERSION_NUM")
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("GID hints (-want +got):\n%s", diff)
			}
			cp, err := checkpoint.NewStore(e.checkpointPath()).Load()
			if err != nil {
				t.Fatal(err)
			}
			wantNet := map[bool]string{true: "host", false: "pod"}[tt.hostNetwork]
			if got := cp.Claims[string(c.UID)].Network; got != wantNet {
				t.Errorf("checkpoint records network %q, want %q (a restart rewrites the spec from it)", got, wantNet)
			}
		})
	}

	t.Run("mixed", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.cfg.AllowNonHostNetwork = true
		e.start()
		c := e.claim("two", hostNetworkPod("p", false), []allocated{{request: "a", device: "mlx5-8"}, {request: "b", device: "mlx5-9"}})
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"b"},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(ipv6)}}},
		}}
		if _, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		r := e.prepare(c)[string(c.UID)]
		if want := "requests a and b ask for different addressFamily (Auto, IPv6)"; !strings.Contains(r.Error, want) {
			t.Fatalf("error %q, want one containing %q", r.Error, want)
		}
		if uids, _ := cdi.NewSpecDir(e.cdiDir).ClaimUIDs(); len(uids) != 0 {
			t.Errorf("refused claim left CDI specs %v", uids)
		}
	})
}

// A container reads what it got from the device metadata file the helper
// bind-mounts: the HCA's attributes, its device node and its GID table.
func TestDeviceMetadataInContainer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.cfg.DeviceMetadata = true
	e.start()
	c := e.claim("meta", hostNetworkPod("p", true), one("mlx5-8"))
	ids := e.mustPrepare(c)
	if len(ids) != 2 {
		t.Fatalf("CDI IDs %v, want the HCA's and the metadata's", ids)
	}
	s := e.container(ids...)
	want := "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/meta/hca/rdma.dra.dev-metadata.json"
	var source string
	for _, m := range s.Mounts {
		if m.Destination == want {
			source = m.Source
		}
	}
	if source == "" {
		t.Fatalf("no mount at %s in %+v", want, s.Mounts)
	}
	raw, err := os.ReadFile(source)
	if err != nil {
		t.Fatal(err)
	}
	var md metadatav1beta1.DeviceMetadata
	if err := json.NewDecoder(bytes.NewReader(raw)).Decode(&md); err != nil {
		t.Fatalf("decoding %s: %v\n%s", source, err, raw)
	}
	if len(md.Requests) != 1 || len(md.Requests[0].Devices) != 1 {
		t.Fatalf("metadata %s: want one request with one device", raw)
	}
	attrs := md.Requests[0].Devices[0].Attributes
	str := func(k string) string {
		if a, ok := attrs[resourceapi.QualifiedName("rdma.dra.dev/"+k)]; ok && a.StringValue != nil {
			return *a.StringValue
		}
		return ""
	}
	for k, want := range map[string]string{
		"ibdev":           "mlx5_8",
		"uverbs":          "/dev/infiniband/uverbs8",
		"netdev":          "ens1f0np0",
		"port1State":      "ACTIVE",
		"port1LinkLayer":  "Ethernet",
		"port1Gid3":       "0000:0000:0000:0000:0000:ffff:0a00:0001",
		"port1Gid3Type":   "RoCE v2",
		"port1Gid3Netdev": "ens1f0np0",
	} {
		if got := str(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if a := attrs["rdma.dra.dev/port1RoceGidIndex"]; a.IntValue == nil || *a.IntValue != 3 {
		t.Errorf("port1RoceGidIndex = %+v, want 3", a)
	}
	if a := attrs["resource.kubernetes.io/pcieRoot"]; a.StringValue == nil || *a.StringValue == "" {
		t.Errorf("pcieRoot missing from %s", raw)
	}

	if r := e.unprepare(ref(c))[string(c.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if _, err := os.Stat(source); !os.IsNotExist(err) {
		t.Errorf("metadata file %s still there after unprepare (%v)", source, err)
	}
	left, _ := filepath.Glob(filepath.Join(e.cdiDir, "*"))
	if len(left) != 0 {
		t.Errorf("CDI dir after unprepare: %v", left)
	}
}

// A claim that consumes hcaHandles/hcaObjects on a shared HCA gets the
// hook that sets its containers' rdma.max and its pod's; one that asks
// nothing does not.
func TestLimitsBecomeTheHook(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.cfg.Shares = 1000
	e.withLimits("/opt/rdma-dra-driver/bin/rdma-dra-hook")
	e.start()

	published := waitForSlices(t, e)
	capacity := published[0].Spec.Devices[0].Capacity
	if _, ok := capacity["rdma.dra.dev/hcaHandles"]; !ok {
		t.Fatalf("published capacities %v, want hcaHandles", capacity)
	}

	tests := []struct {
		name     string
		consumed map[string]int64
		want     []string // the hook's args; nil: no hook
	}{
		{"handles", map[string]int64{"hcaHandles": 1}, []string{"rdma-dra-hook", "limit", "--device=mlx5_8", "--hca-handle=1", "--hca-object=max", "--pod=pod-handles:1:max"}},
		{"both", map[string]int64{"hcaHandles": 2, "hcaObjects": 100}, []string{"rdma-dra-hook", "limit", "--device=mlx5_8", "--hca-handle=2", "--hca-object=100", "--pod=pod-both:2:100"}},
		{"none asked", map[string]int64{"hcaHandles": 0, "hcaObjects": 0}, nil},
	}
	for i, tt := range tests {
		c := e.claim(tt.name, hostNetworkPod(tt.name, true), shared("mlx5-8", fmt.Sprint("share-", i)))
		consumed := map[resourceapi.QualifiedName]resource.Quantity{}
		for k, v := range tt.consumed {
			consumed[resourceapi.QualifiedName("rdma.dra.dev/"+k)] = *resource.NewQuantity(v, resource.DecimalSI)
		}
		c.Status.Allocation.Devices.Results[0].ConsumedCapacity = consumed
		if _, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		s := e.container(e.mustPrepare(c)...)
		var got []string
		if s.Hooks != nil {
			for _, h := range s.Hooks.CreateRuntime {
				if h.Args[1] != "limit" {
					continue // the hostNetwork check: policy_test.go
				}
				if h.Path != e.cfg.HookPath || h.Timeout == nil {
					t.Errorf("%s: hook %+v, want path %s and a timeout", tt.name, h, e.cfg.HookPath)
				}
				got = h.Args
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: createRuntime hook args %q, want %q", tt.name, got, tt.want)
		}
	}
}

// waitForSlices waits for the driver's first publish.
func waitForSlices(t *testing.T, e *env) []resourceapi.ResourceSlice {
	t.Helper()
	var items []resourceapi.ResourceSlice
	err := kwait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := e.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		items = list.Items
		return len(items) > 0, nil
	})
	if err != nil {
		t.Fatalf("no ResourceSlice published within 10s: %v", err)
	}
	return items
}

// A claim's partition is checked against the allocated HCA's P_Key table at
// prepare, and its index handed to NCCL.
func TestPKey(t *testing.T) {
	t.Parallel()
	cfg := func(k string) string {
		return `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","pkey":"` + k + `"}`
	}
	tests := []struct {
		name, device, pkey string
		wantEnv            map[string]string
		wantErr            string
	}{
		{name: "full", device: "mlx5-0", pkey: "0x8001", wantEnv: map[string]string{"NCCL_IB_PKEY": "1", "UCX_IB_PKEY": "0x0001"}},
		{name: "limited", device: "mlx5-0", pkey: "0x0001", wantEnv: map[string]string{"NCCL_IB_PKEY": "1", "UCX_IB_PKEY": "0x0001"}},
		{name: "default", device: "mlx5-1", pkey: "0xffff", wantEnv: map[string]string{"NCCL_IB_PKEY": "0", "UCX_IB_PKEY": "0x7fff"}},
		{name: "absent", device: "mlx5-0", pkey: "0x8005", wantErr: "HCA mlx5_0 port 1 has no P_Key 0x8005 in its table (0xffff at 0, 0x8001 at 1)"},
		{name: "roce", device: "mlx5-8", pkey: "0x8001", wantErr: "HCA mlx5_8 port 1 has no P_Key 0x8001 in its table (0xffff at 0)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.cfg.DeviceMetadata = true
			e.start()
			c := e.claim("pk", hostNetworkPod("p", true), one(tt.device), cfg(tt.pkey))
			r := e.prepare(c)[string(c.UID)]
			if tt.wantErr != "" {
				if !strings.Contains(r.Error, tt.wantErr) {
					t.Fatalf("error %q, want one containing %q", r.Error, tt.wantErr)
				}
				if uids, _ := cdi.NewSpecDir(e.cdiDir).ClaimUIDs(); len(uids) != 0 {
					t.Errorf("refused claim left CDI specs %v", uids)
				}
				return
			}
			if r.Error != "" {
				t.Fatal(r.Error)
			}
			var ids []string
			for _, d := range r.Devices {
				ids = append(ids, d.CdiDeviceIds...)
			}
			s := e.container(ids...)
			if diff := cmp.Diff(tt.wantEnv, envOf(s, "NCCL_IB_PKEY", "UCX_IB_PKEY")); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStartRemovesStaleSpecTemps: the temporary file of a spec write killed
// before its rename (a SIGKILL in recoverSpecs) goes at start once it is
// older than a write takes; a young one may be another daemon's write in
// flight, and stays.
func TestStartRemovesStaleSpecTemps(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	specs := cdi.NewSpecDir(e.cdiDir)
	old := "." + filepath.Base(specs.Path("uid-holder")) + ".123.tmp"
	young := "." + filepath.Base(specs.Path("uid-other")) + ".456.tmp"
	for _, n := range []string{old, young} {
		if err := os.WriteFile(filepath.Join(e.cdiDir, n), []byte("{"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-time.Minute)
	if err := os.Chtimes(filepath.Join(e.cdiDir, old), long, long); err != nil {
		t.Fatal(err)
	}
	e.start()
	if _, err := os.Stat(filepath.Join(e.cdiDir, old)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the stale temporary file %s is still there (%v)", old, err)
	}
	if _, err := os.Stat(filepath.Join(e.cdiDir, young)); err != nil {
		t.Errorf("the young temporary file %s was removed: %v", young, err)
	}
}
