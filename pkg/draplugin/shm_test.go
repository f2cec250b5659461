package draplugin_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi/cditest"
)

// shmMounts are the container's mounts at /dev/shm.
func shmMounts(s *oci.Spec) []oci.Mount {
	var out []oci.Mount
	for _, m := range s.Mounts {
		if m.Destination == "/dev/shm" {
			out = append(out, m)
		}
	}
	return out
}

// TestShmSize: a claim's shmSizeMiB gives its containers a tmpfs /dev/shm
// of that size, in place of the runtime's; without it the claim adds
// none. Two requests of one claim asking for different sizes are refused.
func TestShmSize(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	// The runtime's own /dev/shm, which the claim's replaces.
	runtimeShm := oci.Mount{Destination: "/dev/shm", Type: "bind", Source: "/run/containerd/sandbox/shm", Options: []string{"rbind", "ro"}}

	sized := e.claim("sized", hostNetworkPod("p1", true), one("mlx5-0"), hcaConfig(`"shmSizeMiB":256`))
	s := e.container(e.mustPrepare(sized)...)
	want := []oci.Mount{{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "nodev", "noexec", "mode=1777", "size=256m"}}}
	if got := shmMounts(s); !slices.EqualFunc(got, want, mountEqual) {
		t.Errorf("/dev/shm mounts %+v, want %+v", got, want)
	}
	s = &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}, Mounts: []oci.Mount{runtimeShm}}
	if err := cditest.InjectInto(e.cdiDir, s, e.mustPrepare(sized)...); err != nil {
		t.Fatal(err)
	}
	if got := shmMounts(s); !slices.EqualFunc(got, want, mountEqual) {
		t.Errorf("over the runtime's /dev/shm: mounts %+v, want only %+v", got, want)
	}

	plain := e.claim("plain", hostNetworkPod("p2", true), one("mlx5-1"))
	if got := shmMounts(e.container(e.mustPrepare(plain)...)); len(got) != 0 {
		t.Errorf("a claim without shmSizeMiB mounts %+v at /dev/shm, want nothing", got)
	}

	two := e.claim("two", hostNetworkPod("p3", true), []allocated{{request: "a", device: "mlx5-2"}, {request: "b", device: "mlx5-3"}})
	for _, r := range []struct{ request, cfg string }{{"a", hcaConfig(`"shmSizeMiB":64`)}, {"b", hcaConfig(`"shmSizeMiB":128`)}} {
		two.Status.Allocation.Devices.Config = append(two.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{r.request},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(r.cfg)}}},
		})
	}
	two, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), two, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r := e.prepare(two)[string(two.UID)]; !strings.Contains(r.Error, "requests a and b ask for different shmSizeMiB (64, 128), but a container has one /dev/shm") {
		t.Errorf("two sizes in one claim: error %q", r.Error)
	}
}

func mountEqual(a, b oci.Mount) bool {
	return a.Destination == b.Destination && a.Type == b.Type && a.Source == b.Source && slices.Equal(a.Options, b.Options)
}
