package draplugin_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
)

const testHook = "/opt/rdma-dra-driver/bin/rdma-dra-hook"

// hookArgs lists the args of a container's createRuntime hooks, in order.
func hookArgs(s *oci.Spec) [][]string {
	var out [][]string
	if s.Hooks == nil {
		return nil
	}
	for _, h := range s.Hooks.CreateRuntime {
		out = append(out, h.Args)
	}
	return out
}

// TestHostNetworkHookOnEveryRoute: while non-hostNetwork RDMA is off, every
// device handed out carries the container-start check, first among its
// hooks: a claim's, a shared claim's (a pod joining it later is never
// prepared again) and the legacy device's, naming the HCAs it gives.
// Where the switch allows every pod, no device carries it.
func TestHostNetworkHookOnEveryRoute(t *testing.T) {
	t.Parallel()
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.cfg.AllowNonHostNetwork, e.cfg.Shares, e.cfg.LegacyShares = allow, 1000, 1000
			e.withLimits(testHook)
			e.start()
			own := e.claim("own", hostNetworkPod("a", true), shared("mlx5-0", "33333333-aaaa-4aaa-8aaa-000000000001"))
			limited := e.claim("limited", hostNetworkPod("b", true), shared("mlx5-1", "33333333-aaaa-4aaa-8aaa-000000000002"))
			limited.Status.Allocation.Devices.Results[0].ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
				"rdma.dra.dev/hcaHandles": *resource.NewQuantity(2, resource.DecimalSI)}
			if _, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), limited, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			legacy := e.claim("legacy", hostNetworkPod("c", true), shared("legacy-rdma-hca", "33333333-aaaa-4aaa-8aaa-000000000003"))
			var all []string
			for i := range 10 {
				all = append(all, fmt.Sprintf("--device=mlx5_%d", i))
			}
			for _, tt := range []struct {
				claim *resourceapi.ResourceClaim
				want  [][]string
			}{
				{own, [][]string{{"rdma-dra-hook", "hostnet", "--device=mlx5_0"}}},
				{limited, [][]string{{"rdma-dra-hook", "hostnet", "--device=mlx5_1"}, {"rdma-dra-hook", "limit", "--device=mlx5_1", "--hca-handle=2", "--hca-object=max", "--pod=pod-b:2:max"}}},
				{legacy, [][]string{append([]string{"rdma-dra-hook", "hostnet"}, all...)}},
			} {
				want := tt.want
				if allow {
					want = slices.DeleteFunc(slices.Clone(want), func(a []string) bool { return a[1] == "hostnet" })
					if len(want) == 0 {
						want = nil
					}
				}
				got := hookArgs(e.container(e.mustPrepare(tt.claim)...))
				if !slices.EqualFunc(got, want, slices.Equal) {
					t.Errorf("claim %s: createRuntime hooks %q, want %q", tt.claim.Name, got, want)
				}
			}
		})
	}
}

// classConfig adds an opaque config from the DeviceClass to claim c and
// names the class of its request "hca".
func (e *env) withClass(c *resourceapi.ResourceClaim, class string, configs ...string) *resourceapi.ResourceClaim {
	e.t.Helper()
	c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "hca", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}}
	var fromClass []resourceapi.DeviceAllocationConfiguration
	for _, cfg := range configs {
		fromClass = append(fromClass, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClass,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(cfg)},
			}},
		})
	}
	c.Status.Allocation.Devices.Config = append(fromClass, c.Status.Allocation.Devices.Config...)
	out, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Update(context.Background(), c, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// TestAdminOnlyConfig: a claim may not turn on what only its DeviceClass
// grants (management devices, moving netdevs); it may when the class
// grants it, and it may always turn it off.
func TestAdminOnlyConfig(t *testing.T) {
	t.Parallel()
	const (
		mgmtOn  = `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","managementDevices":true}`
		mgmtOff = `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","managementDevices":false}`
		moveOn  = `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","moveNetdev":true}`
		bothOn  = `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","managementDevices":true,"moveNetdev":true}`
	)
	tests := []struct {
		name      string
		class     []string // the DeviceClass's configs
		claim     []string // the claim's
		wantErr   string
		wantUmad0 bool
	}{
		{name: "mgmt", claim: []string{mgmtOn},
			wantErr: `request hca: the claim's config sets managementDevices: true, which only a DeviceClass's config may turn on, and DeviceClass "ib.rdma.dra.dev" does not`},
		{name: "move", claim: []string{moveOn},
			wantErr: `the claim's config sets moveNetdev: true, which only a DeviceClass's config may turn on, and DeviceClass "ib.rdma.dra.dev" does not`},
		{name: "both", class: []string{mgmtOn}, claim: []string{bothOn},
			wantErr: `sets moveNetdev: true, which only`},
		{name: "class-off", class: []string{mgmtOn, mgmtOff}, claim: []string{mgmtOn},
			wantErr: `sets managementDevices: true`},
		{name: "granted", class: []string{mgmtOn}, claim: []string{mgmtOn}, wantUmad0: true},
		{name: "granted-unasked", class: []string{mgmtOn}, wantUmad0: true},
		{name: "claim-off", class: []string{mgmtOn}, claim: []string{mgmtOff}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.start()
			c := e.withClass(e.claim("cfg", hostNetworkPod("p", true), one("mlx5-0"), tt.claim...), "ib.rdma.dra.dev", tt.class...)
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
			got := slices.Contains(devicesOf(e.container(r.Devices[0].CdiDeviceIds...)), "/dev/infiniband/umad0 c 231:0")
			if got != tt.wantUmad0 {
				t.Errorf("container has umad0: %v, want %v", got, tt.wantUmad0)
			}
		})
	}
}

// TestDefaultLimits: on a node that publishes the RDMA cgroup capacities, a
// shared claim that asks for none gets the node's defaults (never more
// than the capacity or the per-claim ceiling), or is refused where limits
// are required; one that asks keeps its own, up to the ceiling.
func TestDefaultLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		policy   func(*draplugin.HCALimits)
		consumed map[string]int64
		want     []string // the limit hook's args
		wantErr  string
	}{
		{name: "defaults", policy: func(l *draplugin.HCALimits) { l.DefaultHandles, l.DefaultObjects = 4, 1000 },
			want: []string{"rdma-dra-hook", "limit", "--device=mlx5_8", "--hca-handle=4", "--hca-object=1000", "--pod=pod-p:4:1000"}},
		{name: "above", policy: func(l *draplugin.HCALimits) { l.DefaultHandles = 100000 },
			want: []string{"rdma-dra-hook", "limit", "--device=mlx5_8", "--hca-handle=64", "--hca-object=max", "--pod=pod-p:64:max"}},
		{name: "own", policy: func(l *draplugin.HCALimits) { l.DefaultHandles, l.DefaultObjects = 4, 1000 }, consumed: map[string]int64{"hcaHandles": 1},
			want: []string{"rdma-dra-hook", "limit", "--device=mlx5_8", "--hca-handle=1", "--hca-object=1000", "--pod=pod-p:1:1000"}},
		{name: "req-none", policy: func(l *draplugin.HCALimits) { l.Require = true },
			wantErr: "device mlx5-8: the claim asks for no rdma.dra.dev/hcaHandles, and this node requires RDMA cgroup limits on shared HCAs (--require-hca-limits"},
		{name: "req-one", policy: func(l *draplugin.HCALimits) { l.Require = true }, consumed: map[string]int64{"hcaHandles": 1},
			wantErr: "the claim asks for no rdma.dra.dev/hcaObjects"},
		{name: "req-default", policy: func(l *draplugin.HCALimits) { l.Require, l.DefaultObjects = true, 10 }, consumed: map[string]int64{"hcaHandles": 1},
			want: []string{"rdma-dra-hook", "limit", "--device=mlx5_8", "--hca-handle=1", "--hca-object=10", "--pod=pod-p:1:10"}},
		{name: "default under the ceiling", policy: func(l *draplugin.HCALimits) { l.DefaultHandles, l.ClaimMaxPercent = 100, 25 },
			want: []string{"rdma-dra-hook", "limit", "--device=mlx5_8", "--hca-handle=16", "--hca-object=max", "--pod=pod-p:16:max"}},
		{name: "above the ceiling", policy: func(l *draplugin.HCALimits) { l.ClaimMaxPercent = 25 }, consumed: map[string]int64{"hcaHandles": 17},
			wantErr: "device mlx5-8: the claim consumed rdma.dra.dev/hcaHandles 17, more than the 16 one claim may ask of this HCA (--claim-max-percent=25"},
		{name: "at the ceiling", policy: func(l *draplugin.HCALimits) { l.ClaimMaxPercent = 25 }, consumed: map[string]int64{"hcaHandles": 16},
			want: []string{"rdma-dra-hook", "limit", "--device=mlx5_8", "--hca-handle=16", "--hca-object=max", "--pod=pod-p:16:max"}},
		{name: "unlimited", want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.cfg.Shares, e.cfg.AllowNonHostNetwork = 1000, true
			e.withLimits(testHook)
			if tt.policy != nil {
				tt.policy(&e.cfg.Limits)
			}
			e.start()
			c := e.claim("c", hostNetworkPod("p", true), shared("mlx5-8", "44444444-aaaa-4aaa-8aaa-000000000001"))
			if len(tt.consumed) > 0 {
				consumed := map[resourceapi.QualifiedName]resource.Quantity{}
				for k, v := range tt.consumed {
					consumed[resourceapi.QualifiedName("rdma.dra.dev/"+k)] = *resource.NewQuantity(v, resource.DecimalSI)
				}
				c.Status.Allocation.Devices.Results[0].ConsumedCapacity = consumed
				var err error
				if c, err = e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
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
			var got []string
			for _, a := range hookArgs(e.container(r.Devices[0].CdiDeviceIds...)) {
				got = a
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("limit hook %q, want %q", got, tt.want)
			}
		})
	}
}
