package legacy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi/cditest"
)

// wantDevices checks a ListAndWatch response: every share ID, in order,
// with health h.
func wantDevices(t *testing.T, resp *pluginapi.ListAndWatchResponse, h string) {
	t.Helper()
	if len(resp.Devices) != DefaultShares {
		t.Fatalf("ListAndWatch sent %d devices, want %d", len(resp.Devices), DefaultShares)
	}
	for i, d := range resp.Devices {
		if want := fmt.Sprintf("hca-%04d", i); d.ID != want || d.Health != h {
			t.Fatalf("device %d = %s %s, want %s %s", i, d.ID, d.Health, want, h)
		}
	}
}

func TestRegistration(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	p := e.plugin(t)
	if err := p.Update(e.discover(t)); err != nil {
		t.Fatal(err)
	}
	k := startKubelet(t, e.pluginDir)
	run(t, p)

	got := k.registration(t)
	want := &pluginapi.RegisterRequest{
		Version:      "v1beta1",
		Endpoint:     "rdma-hca.sock",
		ResourceName: "rdma/hca",
		Options:      &pluginapi.DevicePluginOptions{},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("RegisterRequest (-want +got):\n%s", diff)
	}
	if p.SocketPath() != filepath.Join(e.pluginDir, got.Endpoint) {
		t.Errorf("endpoint %q is not the socket %s", got.Endpoint, p.SocketPath())
	}
	wantDevices(t, k.list(t), pluginapi.Healthy)

	// The optional calls answer empty, as the options promise.
	c := k.pluginClient()
	ctx := context.Background()
	if r, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{}); err != nil || len(r.ContainerResponses) != 0 {
		t.Errorf("GetPreferredAllocation = %v, %v; want an empty response", r, err)
	}
	if r, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"hca-0000"}}); err != nil || r == nil {
		t.Errorf("PreStartContainer = %v, %v; want an empty response", r, err)
	}
}

// TestKubeletRestart replays what a restarting kubelet does to the
// device-plugin directory, and what else may happen to it.
func TestKubeletRestart(t *testing.T) {
	tests := []struct {
		name string
		// newKubelet: kubelet.sock is deleted and a new kubelet serves a
		// new one; removePlugin: our socket is deleted.
		newKubelet, removePlugin bool
	}{
		{name: "kubelet restart: every socket deleted, new kubelet.sock", newKubelet: true, removePlugin: true},
		{name: "new kubelet.sock, plugin socket left alone", newKubelet: true},
		{name: "plugin socket deleted, same kubelet", removePlugin: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "dgx-h100")
			p := e.plugin(t)
			if err := p.Update(e.discover(t)); err != nil {
				t.Fatal(err)
			}
			k := startKubelet(t, e.pluginDir)
			run(t, p)
			k.registration(t)
			wantDevices(t, k.list(t), pluginapi.Healthy)
			before, err := os.Lstat(p.SocketPath())
			if err != nil {
				t.Fatal(err)
			}

			if tt.newKubelet {
				k.stop()
				if err := os.Remove(filepath.Join(e.pluginDir, KubeletSocketName)); err != nil {
					t.Fatal(err)
				}
			}
			if tt.removePlugin {
				if err := os.Remove(p.SocketPath()); err != nil {
					t.Fatal(err)
				}
			}
			if tt.newKubelet {
				k = startKubelet(t, e.pluginDir)
			}

			got := k.registration(t)
			if got.ResourceName != "rdma/hca" || got.Endpoint != "rdma-hca.sock" {
				t.Errorf("registered again as %s at %s", got.ResourceName, got.Endpoint)
			}
			wantDevices(t, k.list(t), pluginapi.Healthy)
			after, err := os.Lstat(p.SocketPath())
			if err != nil {
				t.Fatal(err)
			}
			if sameFile(before, after) {
				t.Errorf("still serving on the old socket file")
			}
		})
	}
}

func TestListAndWatchHealth(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	p := e.plugin(t)
	k := startKubelet(t, e.pluginDir)
	run(t, p)
	k.registration(t)
	// Before any discovery there is nothing to give.
	wantDevices(t, k.list(t), pluginapi.Unhealthy)

	steps := []struct {
		name        string
		state, phys string // of every port; "" leaves them
		want        string
	}{
		{name: "first discovery", want: pluginapi.Healthy},
		{name: "every port down", state: "1: DOWN", phys: "3: Disabled", want: pluginapi.Unhealthy},
		{name: "ports up again", state: "4: ACTIVE", phys: "5: LinkUp", want: pluginapi.Healthy},
	}
	for _, s := range steps {
		if s.state != "" {
			e.setPorts(t, s.state, s.phys)
		}
		inv := e.discover(t)
		if err := p.Update(inv); err != nil {
			t.Fatal(err)
		}
		// A pass without a change sends nothing: the next message
		// must be the next change.
		if err := p.Update(inv); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: want all %s", s.name, s.want)
		wantDevices(t, k.list(t), s.want)
	}

	// One port up is enough.
	e.setPorts(t, "1: DOWN", "3: Disabled")
	if err := p.Update(e.discover(t)); err != nil {
		t.Fatal(err)
	}
	wantDevices(t, k.list(t), pluginapi.Unhealthy)
	if err := e.node.SetPortState("mlx5_9", 1, "4: ACTIVE", "5: LinkUp"); err != nil {
		t.Fatal(err)
	}
	if err := p.Update(e.discover(t)); err != nil {
		t.Fatal(err)
	}
	wantDevices(t, k.list(t), pluginapi.Healthy)
}

func TestAllocate(t *testing.T) {
	tests := []struct {
		name    string
		missing []int // uverbs nodes deleted from /dev before discovery
		hcas    []int // mlx5_N the container gets
	}{
		{name: "every HCA", hcas: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{name: "an HCA without its uverbs node is left out", missing: []int{3}, hcas: []int{0, 1, 2, 4, 5, 6, 7, 8, 9}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "dgx-h100")
			for _, i := range tt.missing {
				if err := os.Remove(filepath.Join(e.node.DevRoot, "infiniband", fmt.Sprintf("uverbs%d", i))); err != nil {
					t.Fatal(err)
				}
			}
			p := e.plugin(t)
			if err := p.Update(e.discover(t)); err != nil {
				t.Fatal(err)
			}
			run(t, p)
			resp, err := dial(t, p).Allocate(context.Background(), &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"hca-0007"}}},
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.ContainerResponses) != 1 {
				t.Fatalf("%d container responses, want 1", len(resp.ContainerResponses))
			}
			c := resp.ContainerResponses[0]
			wantCDI := []*pluginapi.CDIDevice{{Name: "rdma.dra.dev/hca=all"}}
			if diff := cmp.Diff(wantCDI, c.CdiDevices, protocmp.Transform()); diff != "" {
				t.Fatalf("CdiDevices (-want +got):\n%s", diff)
			}

			// What the container gets through CDI, device by device.
			spec := cditest.Inject(t, e.cdiDir, c.CdiDevices[0].Name)
			wantDevs := []oci.LinuxDevice{e.wantNode("rdma_cm", 10, 58)}
			wantRules := []oci.LinuxDeviceCgroup{cditest.Rule(10, 58)}
			var names, perHCA, ucx []string
			for _, i := range tt.hcas {
				wantDevs = append(wantDevs, e.wantNode(fmt.Sprintf("uverbs%d", i), 231, 192+int64(i)))
				wantRules = append(wantRules, cditest.Rule(231, 192+int64(i)))
				names = append(names, fmt.Sprintf("mlx5_%d", i))
				perHCA = append(perHCA, fmt.Sprintf("RDMA_DEVICE_MLX5_%d=/dev/infiniband/uverbs%d", i, i))
				ucx = append(ucx, fmt.Sprintf("mlx5_%d:1", i))
			}
			if diff := cmp.Diff(wantDevs, spec.Linux.Devices); diff != "" {
				t.Errorf("Linux.Devices (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantRules, spec.Linux.Resources.Devices); diff != "" {
				t.Errorf("device cgroup rules (-want +got):\n%s", diff)
			}
			// IB and RoCE mixed: no NCCL_IB_GID_INDEX.
			list := strings.Join(names, ",")
			wantEnv := append([]string{"PATH=/bin",
				"NCCL_IB_HCA==" + list,
				"RDMA_DEVICES=" + list,
				"UCX_NET_DEVICES=" + strings.Join(ucx, ","),
			}, perHCA...)
			if diff := cmp.Diff(wantEnv, spec.Process.Env); diff != "" {
				t.Errorf("Process.Env (-want +got):\n%s", diff)
			}

			// Without CDI: the same nodes, host paths under the node's
			// dev root, and the same variables.
			var wantSpecs []*pluginapi.DeviceSpec
			for _, d := range append(slices.Clone(wantDevs[1:]), wantDevs[0]) {
				name := filepath.Base(d.Path)
				wantSpecs = append(wantSpecs, &pluginapi.DeviceSpec{
					ContainerPath: d.Path, HostPath: filepath.Join(e.node.DevRoot, "infiniband", name), Permissions: "rw",
				})
			}
			if diff := cmp.Diff(wantSpecs, c.Devices, protocmp.Transform()); diff != "" {
				t.Errorf("DeviceSpecs (-want +got):\n%s", diff)
			}
			for _, d := range c.Devices {
				if _, err := os.Stat(d.HostPath); err != nil {
					t.Errorf("DeviceSpec host path: %v", err)
				}
			}
			envs := map[string]string{}
			for _, kv := range spec.Process.Env[1:] {
				k, v, _ := strings.Cut(kv, "=")
				envs[k] = v
			}
			if diff := cmp.Diff(envs, c.Envs); diff != "" {
				t.Errorf("Envs differ from the CDI device's (-cdi +allocate):\n%s", diff)
			}
			if !strings.HasPrefix(c.Envs["NCCL_IB_HCA"], "=") {
				t.Errorf("NCCL_IB_HCA = %q, want NCCL's exact-match prefix", c.Envs["NCCL_IB_HCA"])
			}
		})
	}
}

func TestAllocateMany(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	p := e.plugin(t)
	if err := p.Update(e.discover(t)); err != nil {
		t.Fatal(err)
	}
	run(t, p)
	resp, err := dial(t, p).Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{"hca-0000", "hca-0999"}},
			{DevicesIds: []string{"hca-0001"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ContainerResponses) != 2 {
		t.Fatalf("%d container responses, want 2", len(resp.ContainerResponses))
	}
	// Any number of IDs, any container: the same, whole node.
	if diff := cmp.Diff(resp.ContainerResponses[0], resp.ContainerResponses[1], protocmp.Transform()); diff != "" {
		t.Errorf("containers get different HCAs (-first +second):\n%s", diff)
	}
}

func TestAllocateErrors(t *testing.T) {
	tests := []struct {
		name     string
		preset   string
		update   bool
		noUverbs bool // delete every uverbs node before discovery
		ids      []string
		code     codes.Code
		want     string
	}{
		{name: "before any discovery", preset: "dgx-h100", ids: []string{"hca-0000"},
			code: codes.FailedPrecondition, want: "rdma/hca: the node's HCAs have not been discovered yet"},
		{name: "an ID never advertised", preset: "dgx-h100", update: true, ids: []string{"hca-1000"},
			code: codes.InvalidArgument, want: `rdma/hca: device ID "hca-1000" was never advertised (IDs are hca-0000..hca-0999)`},
		{name: "node without HCAs", preset: "empty", update: true, ids: []string{"hca-0000"},
			code: codes.FailedPrecondition, want: "rdma/hca: nothing to allocate: the node has no HCAs"},
		{name: "no usable HCA", preset: "dgx-h100", update: true, noUverbs: true, ids: []string{"hca-0000"},
			code: codes.FailedPrecondition, want: "rdma/hca: nothing to allocate: no HCA is usable (mlx5_0: /dev/infiniband/uverbs0 is missing under "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.preset)
			if tt.noUverbs {
				for i := range 10 {
					if err := os.Remove(filepath.Join(e.node.DevRoot, "infiniband", fmt.Sprintf("uverbs%d", i))); err != nil {
						t.Fatal(err)
					}
				}
			}
			p := e.plugin(t)
			if tt.update {
				if err := p.Update(e.discover(t)); err != nil {
					t.Fatal(err)
				}
			}
			run(t, p)
			_, err := dial(t, p).Allocate(context.Background(), &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: tt.ids}},
			})
			st := status.Convert(err)
			if err == nil || st.Code() != tt.code || !strings.Contains(st.Message(), tt.want) {
				t.Fatalf("Allocate error = %v, want %s containing %q", err, tt.code, tt.want)
			}
		})
	}
}

// TestSpecFile covers the life of the node-wide spec file.
func TestSpecFile(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	p := e.plugin(t)
	path := cdi.NewSpecDir(e.cdiDir).Path(SpecUID)
	if filepath.Base(path) != "rdma.dra.dev-hca_device-plugin.json" {
		t.Errorf("spec file %s", path)
	}
	stat := func() os.FileInfo {
		t.Helper()
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	if err := p.Update(e.discover(t)); err != nil {
		t.Fatal(err)
	}
	first := stat()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	// Unchanged content is not rewritten (every write is a new file).
	if err := p.Update(e.discover(t)); err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(first, stat()) {
		t.Errorf("Update rewrote an unchanged spec")
	}

	// Another plugin on the same node writes the same bytes.
	other, err := New(e.config())
	if err != nil {
		t.Fatal(err)
	}
	other.cfg.CDI = cdi.NewSpecDir(filepath.Join(e.dir, "cdi2"))
	if err := other.Update(e.discover(t)); err != nil {
		t.Fatal(err)
	}
	again, err := os.ReadFile(filepath.Join(e.dir, "cdi2", filepath.Base(path)))
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(data) {
		t.Errorf("spec not deterministic:\n%s\nthen\n%s", data, again)
	}

	// A vanished file is written by the next Update, and by Allocate.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := p.Update(e.discover(t)); err != nil {
		t.Fatal(err)
	}
	stat()
	run(t, p)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := dial(t, p).Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"hca-0000"}}},
	}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != string(data) {
		t.Errorf("Allocate did not restore the spec file: %v", err)
	}

	// No usable HCA left: no spec.
	for i := range 10 {
		if err := e.node.RemoveHCA(fmt.Sprintf("mlx5_%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Update(e.discover(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("spec file of a node without HCAs: %v, want it removed", err)
	}
}

func TestUpdateError(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	p := e.plugin(t)
	inv := e.discover(t)
	if err := p.Update(inv); err != nil {
		t.Fatal(err)
	}
	bad := inv
	bad.HCAs = slices.Clone(inv.HCAs)
	u := *bad.HCAs[2].Uverbs
	u.Major = 0
	bad.HCAs[2].Uverbs = &u
	err := p.Update(bad)
	if err == nil || !strings.Contains(err.Error(), "device plugin for rdma/hca: HCA mlx5_2: device uverbs2 has no device number") {
		t.Fatalf("Update error = %v", err)
	}
	// The last good state still answers.
	run(t, p)
	resp, err := dial(t, p).Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"hca-0000"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.ContainerResponses[0].Devices); n != 11 {
		t.Errorf("%d device specs after a failed Update, want the last good 11", n)
	}
}

func TestRunErrors(t *testing.T) {
	e := newEnv(t, "empty")
	cfg := e.config()
	cfg.DevicePluginDir = filepath.Join(e.dir, "missing")
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), filepath.Join(e.dir, "missing", "rdma-hca.sock")) {
		t.Errorf("Run in a missing directory: %v, want an error naming the socket", err)
	}

	p = e.plugin(t)
	if err := os.WriteFile(p.SocketPath(), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "exists and is not a socket") {
		t.Errorf("Run with a file in the way: %v", err)
	}
	if err := os.Remove(p.SocketPath()); err != nil {
		t.Fatal(err)
	}

	run(t, p)
	if err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second Run: %v", err)
	}
}

func TestNew(t *testing.T) {
	long := "/" + strings.Repeat("d", 100)
	tests := []struct {
		name    string
		edit    func(*Config)
		wantErr string
		check   func(*testing.T, *Plugin)
	}{
		{name: "defaults", check: func(t *testing.T, p *Plugin) {
			if p.cfg.ResourceName != "rdma/hca" || p.cfg.Shares != 1000 || p.cfg.PollInterval != DefaultPollInterval {
				t.Errorf("defaults: %+v", p.cfg)
			}
			if p.CDIDevice() != "rdma.dra.dev/hca=all" {
				t.Errorf("CDI device %s", p.CDIDevice())
			}
		}},
		{name: "other resource", edit: func(c *Config) { c.ResourceName = "example.com/rdma_shared"; c.Shares = 10 }, check: func(t *testing.T, p *Plugin) {
			if filepath.Base(p.SocketPath()) != "example.com-rdma_shared.sock" || len(p.ids) != 10 || p.ids[9] != "hca-0009" {
				t.Errorf("socket %s, ids %v", p.SocketPath(), p.ids)
			}
		}},
		{name: "native resource", edit: func(c *Config) { c.ResourceName = "memory" }, wantErr: `resource name "memory" is not an extended resource name`},
		{name: "kubernetes.io resource", edit: func(c *Config) { c.ResourceName = "kubernetes.io/hca" }, wantErr: "is not an extended resource name"},
		{name: "bad name", edit: func(c *Config) { c.ResourceName = "rdma/h ca" }, wantErr: `resource name "rdma/h ca": name part must consist of`},
		{name: "negative shares", edit: func(c *Config) { c.Shares = -1 }, wantErr: "shares -1 out of range 1..10000"},
		{name: "too many shares", edit: func(c *Config) { c.Shares = 10001 }, wantErr: "shares 10001 out of range"},
		{name: "negative poll", edit: func(c *Config) { c.PollInterval = -1 }, wantErr: "negative poll interval"},
		{name: "no CDI dir", edit: func(c *Config) { c.CDI = nil }, wantErr: "no CDI spec directory"},
		{name: "relative dir", edit: func(c *Config) { c.DevicePluginDir = "device-plugins" }, wantErr: `device-plugin directory "device-plugins" is not an absolute path`},
		{name: "socket path too long", edit: func(c *Config) { c.DevicePluginDir = long }, wantErr: "longer than the 107 a unix socket allows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{DevicePluginDir: "/var/lib/kubelet/device-plugins", CDI: cdi.NewSpecDir("/var/run/cdi")}
			if tt.edit != nil {
				tt.edit(&cfg)
			}
			p, err := New(cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, p)
		})
	}
}

func TestValidateMode(t *testing.T) {
	tests := []struct {
		legacy, sharing string
		wantErr         string
	}{
		{legacy: "device-plugin", sharing: "shared"},
		{legacy: "device-plugin", sharing: "exclusive", wantErr: "--legacy=device-plugin hands every HCA to every rdma/hca pod, so it needs --sharing=shared (the HCAs are shared), not --sharing=exclusive; set --sharing=shared or use --legacy=off"},
		{legacy: "device-plugin", sharing: "", wantErr: "not --sharing=(unset)"},
		{legacy: "off", sharing: "exclusive"},
		{legacy: "off", sharing: "shared"},
		{legacy: "extended-resource", sharing: "exclusive"},
	}
	for _, tt := range tests {
		err := ValidateMode(tt.legacy, tt.sharing)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("ValidateMode(%q, %q) = %v, want %q", tt.legacy, tt.sharing, err, tt.wantErr)
		}
	}
}

func TestSocketName(t *testing.T) {
	for in, want := range map[string]string{
		"rdma/hca":                "rdma-hca.sock",
		"example.com/rdma_shared": "example.com-rdma_shared.sock",
		"a/b c":                   "a-b-c.sock",
	} {
		if got := SocketName(in); got != want {
			t.Errorf("SocketName(%q) = %q, want %q", in, got, want)
		}
	}
}
