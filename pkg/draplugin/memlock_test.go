package draplugin_test

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
)

// memlockArgs is the memlock hook of a container, or nil.
func memlockArgs(t *testing.T, e *env, ids []string) []string {
	t.Helper()
	var out []string
	for _, a := range hookArgs(e.container(ids...)) {
		if a[1] == "memlock" {
			if out != nil {
				t.Fatalf("two memlock hooks: %q and %q", out, a)
			}
			out = a
		}
	}
	return out
}

func hcaConfig(fields string) string {
	return `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig",` + fields + `}`
}

// TestMemlockOnEveryRoute: every device handed out carries the memlock
// hook, last among its hooks, naming the HCAs it gives, with the node's
// --memlock: an exclusive claim's, a shared claim's and the legacy
// device's. With --memlock=off (Config.Memlock empty) none does.
func TestMemlockOnEveryRoute(t *testing.T) {
	t.Parallel()
	var all []string
	for i := range 10 {
		all = append(all, fmt.Sprintf("--device=mlx5_%d", i))
	}
	for _, memlock := range []string{"unlimited", "8388608", ""} {
		for _, tt := range []struct {
			route  string
			shares int64
			devs   []allocated
			want   []string
		}{
			{"exclusive", 0, one("mlx5-2"), []string{"--device=mlx5_2"}},
			{"shared", 1000, shared("mlx5-1", "55555555-aaaa-4aaa-8aaa-000000000002"), []string{"--device=mlx5_1"}},
			{"legacy", 1000, shared("legacy-rdma-hca", "55555555-aaaa-4aaa-8aaa-000000000003"), all},
		} {
			// Short names: the kubelet's registration socket lives under
			// the test's temp dir, and a unix socket path has 107 bytes.
			t.Run(tt.route+"/"+cmp.Or(memlock, "off"), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				e.cfg.Shares, e.cfg.HookPath, e.cfg.Memlock = tt.shares, testHook, memlock
				if tt.route == "legacy" {
					e.cfg.LegacyShares = 1000
				}
				e.start()
				c := e.claim("c", hostNetworkPod("p", true), tt.devs)
				hooks := hookArgs(e.container(e.mustPrepare(c)...))
				if memlock == "" {
					if slices.ContainsFunc(hooks, func(a []string) bool { return a[1] == "memlock" }) {
						t.Errorf("--memlock=off: hooks %q, want no memlock", hooks)
					}
					return
				}
				want := append(append([]string{"rdma-dra-hook", "memlock"}, tt.want...), "--bytes="+memlock)
				if len(hooks) == 0 || !slices.Equal(hooks[len(hooks)-1], want) {
					t.Errorf("createRuntime hooks %q, want the last %q", hooks, want)
				}
			})
		}
	}
}

// TestMemlockConfig: a DeviceClass's memlock replaces the node's, and is
// the ceiling of its claims; a claim may ask for less, never more, and
// nothing where the node gives no memlock.
func TestMemlockConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		node    string // Config.Memlock; "" is --memlock=off
		class   []string
		claim   []string
		want    string // --bytes of the hook; "" none
		wantErr string
	}{
		{name: "node default", node: "unlimited", want: "unlimited"},
		{name: "node bytes", node: "8388608", want: "8388608"},
		{name: "off", want: ""},
		{name: "class", node: "unlimited", class: []string{hcaConfig(`"memlock":"256Mi"`)}, want: "268435456"},
		{name: "class above node", node: "8388608", class: []string{hcaConfig(`"memlock":"unlimited"`)}, want: "unlimited"},
		{name: "claim less than class", node: "unlimited", class: []string{hcaConfig(`"memlock":"256Mi"`)}, claim: []string{hcaConfig(`"memlock":"64Mi"`)}, want: "67108864"},
		{name: "claim equal to class", node: "unlimited", class: []string{hcaConfig(`"memlock":"256Mi"`)}, claim: []string{hcaConfig(`"memlock":"268435456"`)}, want: "268435456"},
		{name: "claim less than node", node: "unlimited", claim: []string{hcaConfig(`"memlock":"1Gi"`)}, want: "1073741824"},
		{name: "claim more than class", node: "unlimited", class: []string{hcaConfig(`"memlock":"256Mi"`)}, claim: []string{hcaConfig(`"memlock":"1Gi"`)},
			wantErr: `request hca: the claim's config sets memlock: 1Gi, more than its ceiling 256Mi (DeviceClass "ib.rdma.dra.dev"'s memlock); a claim may only ask for less`},
		{name: "claim unlimited over class", node: "unlimited", class: []string{hcaConfig(`"memlock":"256Mi"`)}, claim: []string{hcaConfig(`"memlock":"unlimited"`)},
			wantErr: `the claim's config sets memlock: unlimited, more than its ceiling 256Mi`},
		{name: "claim more than node", node: "8388608", claim: []string{hcaConfig(`"memlock":"9Mi"`)},
			wantErr: `the claim's config sets memlock: 9Mi, more than its ceiling 8Mi (this node's --memlock)`},
		{name: "claim with node off", claim: []string{hcaConfig(`"memlock":"1Mi"`)},
			wantErr: `request hca: the claim's config sets memlock: 1Mi, but this node gives containers no memlock (--memlock=off`},
		{name: "class with node off", class: []string{hcaConfig(`"memlock":"1Gi"`)},
			wantErr: `request hca: DeviceClass "ib.rdma.dra.dev" sets memlock: 1Gi, but this node gives containers no memlock`},
		{name: "bad value", node: "unlimited", claim: []string{hcaConfig(`"memlock":"lots"`)},
			wantErr: `memlock: want "unlimited" or a quantity of bytes such as 256Mi, got "lots"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.cfg.HookPath, e.cfg.Memlock = testHook, tt.node
			e.start()
			c := e.withClass(e.claim("c", hostNetworkPod("p", true), one("mlx5-0"), tt.claim...), "ib.rdma.dra.dev", tt.class...)
			r := e.prepare(c)[string(c.UID)]
			if tt.wantErr != "" {
				if !strings.Contains(r.Error, tt.wantErr) {
					t.Fatalf("error %q, want one containing %q", r.Error, tt.wantErr)
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
			got := memlockArgs(t, e, ids)
			switch {
			case tt.want == "" && got != nil:
				t.Errorf("memlock hook %q, want none", got)
			case tt.want != "" && !slices.Equal(got, []string{"rdma-dra-hook", "memlock", "--device=mlx5_0", "--bytes=" + tt.want}):
				t.Errorf("memlock hook %q, want --bytes=%s", got, tt.want)
			}
		})
	}
}

// TestMemlockSurvivesRestart: the checkpoint records each device's memlock,
// so a daemon restarted with another --memlock rewrites identical specs;
// a record of an older release (no memlock) gets the node's --memlock.
func TestMemlockSurvivesRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.cfg.HookPath, e.cfg.Memlock = testHook, "unlimited"
	e.start()
	classed := e.withClass(e.claim("classed", hostNetworkPod("p1", true), one("mlx5-0")), "ib.rdma.dra.dev", hcaConfig(`"memlock":"256Mi"`))
	plain := e.claim("plain", hostNetworkPod("p2", true), one("mlx5-1"))
	idsClassed, idsPlain := e.mustPrepare(classed), e.mustPrepare(plain)
	spec := func(uid string) []byte {
		t.Helper()
		b, err := os.ReadFile(cdi.NewSpecDir(e.cdiDir).Path(uid))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	before := spec(string(classed.UID))
	e.stop()

	// An older release's record of plain: no memlock.
	store := checkpoint.NewStore(e.checkpointPath())
	if err := store.Update(func(cp *checkpoint.Checkpoint) error {
		c := cp.Claims[string(plain.UID)]
		for i := range c.Devices {
			c.Devices[i].Memlock = ""
		}
		cp.Claims[string(plain.UID)] = c
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.cfg.Memlock = "8388608"
	e.start()
	if after := spec(string(classed.UID)); string(after) != string(before) {
		t.Errorf("spec after a restart with another --memlock:\n%s\nwant it unchanged:\n%s", after, before)
	}
	if got, want := memlockArgs(t, e, idsClassed), []string{"rdma-dra-hook", "memlock", "--device=mlx5_0", "--bytes=268435456"}; !slices.Equal(got, want) {
		t.Errorf("class's claim after the restart: memlock hook %q, want %q", got, want)
	}
	if got, want := memlockArgs(t, e, idsPlain), []string{"rdma-dra-hook", "memlock", "--device=mlx5_1", "--bytes=8388608"}; !slices.Equal(got, want) {
		t.Errorf("an older release's record after the restart: memlock hook %q, want the node's %q", got, want)
	}
}
