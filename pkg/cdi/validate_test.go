package cdi

import (
	"os"
	"path/filepath"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// TestWrittenSpecsReadBack: validateAsCDI, which WriteClaim runs instead of
// reading its file back, agrees with the CDI library's reader on every
// spec: what it accepts, cdi.ReadSpec loads from the file WriteClaim's
// encoding makes; what it refuses, cdi.ReadSpec refuses too.
func TestWrittenSpecsReadBack(t *testing.T) {
	good, err := DeviceEdits(ibHCA(0), EditOptions{Env: true, ManagementDevices: true})
	if err != nil {
		t.Fatal(err)
	}
	roce, err := DeviceEdits(roceHCA(1, active(3), down(-1)), EditOptions{Env: true, HostDevRoot: "/sim/dev"})
	if err != nil {
		t.Fatal(err)
	}
	common := CommonEdits(rdmaCM, []hca.HCA{ibHCA(0), ibHCA(1)}, EditOptions{Env: true})
	hook := cdispec.ContainerEdits{Hooks: []*cdispec.Hook{{HookName: "createContainer", Path: "/usr/bin/rdma-dra-hook", Args: []string{"rdma-dra-hook", "memlock"}}}}
	shm := cdispec.ContainerEdits{Mounts: []*cdispec.Mount{{HostPath: "tmpfs", ContainerPath: "/dev/shm", Type: "tmpfs", Options: []string{"size=64m"}}}}
	spec := func(kind string, common cdispec.ContainerEdits, devs ...cdispec.Device) *cdispec.Spec {
		s := &cdispec.Spec{Kind: kind, ContainerEdits: common, Devices: devs}
		v, err := cdispec.MinimumRequiredVersion(s)
		if err != nil {
			t.Fatal(err)
		}
		s.Version = v
		return s
	}
	dev := func(name string, e cdispec.ContainerEdits) cdispec.Device {
		return cdispec.Device{Name: name, ContainerEdits: e}
	}
	for _, tc := range []struct {
		name string
		spec *cdispec.Spec
		ok   bool
	}{
		{"one HCA", spec(Kind, common, dev(uidA+"-mlx5-0", good)), true},
		{"two HCAs, RoCE", spec(Kind, common, dev(uidA+"-mlx5-0", good), dev(uidA+"-mlx5-1", roce)), true},
		{"hooks and mounts", spec(Kind, hook, dev(uidA+"-mlx5-0", shm)), true},
		{"no spec-level edits", spec(Kind, cdispec.ContainerEdits{}, dev("d0", good)), true},
		{"bad device name", spec(Kind, common, dev("-bad", good)), false},
		{"empty device edits", spec(Kind, common, dev("d0", cdispec.ContainerEdits{})), false},
		{"bad env", spec(Kind, cdispec.ContainerEdits{Env: []string{"=x"}}, dev("d0", good)), false},
		{"bad env in a device", spec(Kind, common, dev("d0", cdispec.ContainerEdits{Env: []string{"=x"}})), false},
		{"bad vendor", spec("-rdma.dra.dev/hca", common, dev("d0", good)), false},
		{"bad class", spec("rdma.dra.dev/-hca", common, dev("d0", good)), false},
		{"bad version", func() *cdispec.Spec { s := spec(Kind, common, dev("d0", good)); s.Version = "9.9"; return s }(), false},
		{"hook without a path", spec(Kind, cdispec.ContainerEdits{Hooks: []*cdispec.Hook{{HookName: "createContainer"}}}, dev("d0", good)), false},
		{"unknown hook", spec(Kind, common, dev("d0", cdispec.ContainerEdits{Hooks: []*cdispec.Hook{{HookName: "whenever", Path: "/bin/true"}}})), false},
		{"mount without a container path", spec(Kind, common, dev("d0", cdispec.ContainerEdits{Mounts: []*cdispec.Mount{{HostPath: "/x"}}})), false},
		{"device node without a path", spec(Kind, common, dev("d0", cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Type: "c", Major: 1}}})), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ours := validateAsCDI(tc.spec)
			data, err := marshalSpec(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "spec.json")
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, lib := cdiapi.ReadSpec(path, 0)
			if (ours == nil) != tc.ok || (lib == nil) != tc.ok {
				t.Errorf("validateAsCDI: %v; cdi.ReadSpec: %v; want both to accept: %v", ours, lib, tc.ok)
			}
		})
	}
}
