package legacy

import (
	"context"
	"slices"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi/cditest"
)

// TestAllocateWithHooks: where the hostNetwork switch is off the node-wide
// device carries the hook's check, first, the default limits of every
// HCA, for the container and for its pod (any pod: the plugin sees none),
// and the memlock hook naming them all; Allocate then answers with the CDI device alone, so a container
// cannot get the device nodes past the hooks.
func TestAllocateWithHooks(t *testing.T) {
	const hook = "/opt/rdma-dra-driver/bin/rdma-dra-hook"
	e := newEnv(t, "dgx-h100")
	cfg := e.config()
	cfg.Hooks = Hooks{HookPath: hook, HostNetworkOnly: true, HCAHandles: 4, Memlock: "268435456"}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Update(e.discover(t)); err != nil {
		t.Fatal(err)
	}
	run(t, p)
	resp, err := dial(t, p).Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"hca-0003"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := resp.ContainerResponses[0]
	if len(c.CdiDevices) != 1 || c.CdiDevices[0].Name != "rdma.dra.dev/hca=all" || len(c.Devices) > 0 || len(c.Envs) > 0 || len(c.Mounts) > 0 {
		t.Fatalf("Allocate = %v, want the CDI device alone", c)
	}
	spec := cditest.Inject(t, e.cdiDir, c.CdiDevices[0].Name)
	if spec.Hooks == nil || len(spec.Hooks.CreateRuntime) != 12 {
		t.Fatalf("createRuntime hooks %+v, want the check, 10 limits and the memlock", spec.Hooks)
	}
	check := spec.Hooks.CreateRuntime[0]
	if check.Path != hook || !slices.Equal(check.Args[:2], []string{"rdma-dra-hook", "hostnet"}) || len(check.Args) != 12 || check.Args[2] != "--device=mlx5_0" {
		t.Errorf("first hook %s %q, want the hostNetwork check naming the 10 HCAs", check.Path, check.Args)
	}
	hooks := spec.Hooks.CreateRuntime
	if ml := hooks[len(hooks)-1]; ml.Path != hook || !slices.Equal(ml.Args[:3], []string{"rdma-dra-hook", "memlock", "--device=mlx5_0"}) ||
		len(ml.Args) != 13 || ml.Args[12] != "--bytes=268435456" {
		t.Errorf("last hook %s %q, want the memlock of 256 MiB naming the 10 HCAs", ml.Path, ml.Args)
	}
	for _, h := range hooks[1 : len(hooks)-1] {
		if len(h.Args) != 6 || h.Args[1] != "limit" || !strings.HasPrefix(h.Args[2], "--device=mlx5_") || h.Args[3] != "--hca-handle=4" || h.Args[4] != "--hca-object=max" || h.Args[5] != "--pod=*:4:max" {
			t.Errorf("hook %q, want a limit of 4 handles for the container and its pod, whichever", h.Args)
		}
	}

	for _, h := range []Hooks{{HostNetworkOnly: true}, {Memlock: "unlimited"}} {
		cfg.Hooks = h
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "need the hook's host path") {
			t.Errorf("hooks %+v without a hook path: %v", h, err)
		}
	}
	cfg.Hooks = Hooks{HookPath: "bin/rdma-dra-hook"}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "not an absolute path") {
		t.Errorf("a relative hook path: %v", err)
	}
}
