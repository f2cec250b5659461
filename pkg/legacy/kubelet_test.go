package legacy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi/cditest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

// wait bounds every wait for the plugin; nothing asserts a shorter time.
const wait = 5 * time.Second

// kubelet stands in for the kubelet's device manager: a real registration
// server on <dir>/kubelet.sock that, like the kubelet, dials a registering
// plugin back with the generated client, asks for its options and keeps a
// ListAndWatch stream open.
type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir   string
	srv   *grpc.Server
	regs  chan *pluginapi.RegisterRequest
	lists chan *pluginapi.ListAndWatchResponse
	done  chan struct{}

	mu      sync.Mutex
	client  pluginapi.DevicePluginClient // of the last registration
	conns   []*grpc.ClientConn
	streams sync.WaitGroup
	stopped bool
}

// startKubelet serves a new kubelet.sock in dir.
func startKubelet(t *testing.T, dir string) *kubelet {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, KubeletSocketName), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	// The test removes it, as a restarting kubelet does.
	l.SetUnlinkOnClose(false)
	k := &kubelet{
		dir:   dir,
		srv:   grpc.NewServer(),
		regs:  make(chan *pluginapi.RegisterRequest, 16),
		lists: make(chan *pluginapi.ListAndWatchResponse, 64),
		done:  make(chan struct{}),
	}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(l) }()
	t.Cleanup(k.stop)
	return k
}

func (k *kubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if !slices.Contains(pluginapi.SupportedVersions[:], r.Version) {
		return nil, fmt.Errorf("unsupported version %q", r.Version)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	client := pluginapi.NewDevicePluginClient(conn)
	if _, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("plugin options: %w", err)
	}
	stream, err := client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("ListAndWatch: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		_ = conn.Close()
		return nil, errors.New("kubelet stopped")
	}
	k.client = client
	k.conns = append(k.conns, conn)
	k.streams.Add(1)
	go func() {
		defer k.streams.Done()
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case k.lists <- resp:
			case <-k.done:
				return
			}
		}
	}()
	k.regs <- r
	return &pluginapi.Empty{}, nil
}

// stop shuts the kubelet down and closes its plugin connections; the
// socket file stays, as a crashed kubelet leaves it.
func (k *kubelet) stop() {
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		return
	}
	k.stopped = true
	close(k.done)
	conns := k.conns
	k.mu.Unlock()
	k.srv.Stop()
	for _, c := range conns {
		_ = c.Close()
	}
	k.streams.Wait()
}

// registration waits for the next Register.
func (k *kubelet) registration(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.regs:
		return r
	case <-time.After(wait):
		t.Fatalf("the plugin did not register with the kubelet at %s within %s", k.dir, wait)
		return nil
	}
}

// list waits for the next ListAndWatch response.
func (k *kubelet) list(t *testing.T) *pluginapi.ListAndWatchResponse {
	t.Helper()
	select {
	case r := <-k.lists:
		return r
	case <-time.After(wait):
		t.Fatalf("no ListAndWatch response within %s", wait)
		return nil
	}
}

func (k *kubelet) pluginClient() pluginapi.DevicePluginClient {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.client
}

// shortDir is a temporary directory short enough for unix sockets.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// env is one simulated node with a device-plugin and a CDI directory.
type env struct {
	dir, pluginDir, cdiDir string
	node                   *hcatest.Node
}

// wantNode is the device a container gets for the node's name: with the
// host node's mode, which the CDI library copies, where it is a device.
func (e *env) wantNode(name string, major, minor int64) oci.LinuxDevice {
	if !e.node.CharDevices {
		return cditest.Node(name, major, minor)
	}
	return cditest.NodeMode(name, major, minor, hcatest.NodeMode(name))
}

func newEnv(t *testing.T, preset string) *env {
	t.Helper()
	dir := shortDir(t)
	spec, err := hcatest.Preset(preset)
	if err != nil {
		t.Fatal(err)
	}
	n, err := hcatest.Build(filepath.Join(dir, "node"), spec)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{dir: dir, pluginDir: filepath.Join(dir, "dp"), cdiDir: filepath.Join(dir, "cdi"), node: n}
	if err := os.Mkdir(e.pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) discover(t *testing.T) hca.Inventory {
	t.Helper()
	n := e.node
	inv, err := hca.Discover(hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot), hca.WithReadFile(n.ReadFile))
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func (e *env) config() Config {
	return Config{
		DevicePluginDir: e.pluginDir,
		CDI:             cdi.NewSpecDir(e.cdiDir),
		EditOptions:     cdi.EditOptions{Env: true, HostDevRoot: e.node.DevRoot},
	}
}

func (e *env) plugin(t *testing.T) *Plugin {
	t.Helper()
	p, err := New(e.config())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// setPorts sets every port of every HCA.
func (e *env) setPorts(t *testing.T, state, phys string) {
	t.Helper()
	for _, h := range e.node.Spec.HCAs {
		for i := range h.Ports {
			if err := e.node.SetPortState(h.Name, i+1, state, phys); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// run runs p until the test ends, then checks Run returned nil and removed
// its socket. It returns once p serves on its socket.
func run(t *testing.T, p *Plugin) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
		if _, err := os.Lstat(p.SocketPath()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s after Run returned: %v, want it removed", p.SocketPath(), err)
		}
	})
	// Wait until the socket accepts connections, not until the file
	// exists: bind(2) makes the file and listen(2) comes after it, and a
	// connect in between is refused, which fails a gRPC call at once
	// (Unavailable) instead of reaching the plugin.
	waitFor(t, "the plugin socket to accept connections", func() bool {
		c, err := net.Dial("unix", p.SocketPath())
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	})
}

// dial connects to a plugin as the kubelet does.
func dial(t *testing.T, p *Plugin) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+p.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// waitFor polls cond until it holds, failing after wait.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", wait, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
