package cdi

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi/cditest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

// TestNodesFollowTheHost: the spec names no mode, so the container's node
// gets the host node's (udev's 0666 for uverbs and rdma_cm, 0600 for umad
// and issm, or what an admin tightened it to), and the CDI library makes
// a non-root container user its owner: that user opens its uverbs and
// rdma_cm without any capability.
func TestNodesFollowTheHost(t *testing.T) {
	spec, err := hcatest.Preset("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	n, err := hcatest.Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if !n.CharDevices {
		t.Skip("not root: the simulated node's device nodes are plain files, which the CDI library does not read a mode from")
	}
	inv, err := hca.Discover(hca.WithSysfsRoot(n.SysfsRoot), hca.WithDevRoot(n.DevRoot))
	if err != nil {
		t.Fatal(err)
	}
	h := inv.HCAs[0]
	// An admin tightened one HCA's uverbs node.
	if err := os.Chmod(filepath.Join(n.DevRoot, "infiniband", "uverbs1"), 0o660); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	opts := EditOptions{ManagementDevices: true, HostDevRoot: n.DevRoot}
	var devs []ClaimDevice
	var ids []string
	for _, h := range inv.HCAs[:2] {
		ed, err := DeviceEdits(h, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ed.DeviceNodes {
			if d.FileMode != nil || d.UID != nil || d.GID != nil {
				t.Errorf("%s: the spec sets mode %v, uid %v, gid %v; want the host's", d.Path, d.FileMode, d.UID, d.GID)
			}
		}
		devs = append(devs, ClaimDevice{Name: DeviceName(uidA, h.Name, ""), Edits: ed})
		ids = append(ids, QualifiedName(DeviceName(uidA, h.Name, "")))
	}
	if err := NewSpecDir(dir).WriteClaim(uidA, CommonEdits(inv.RDMACM, inv.HCAs[:2], opts), devs); err != nil {
		t.Fatal(err)
	}
	for _, user := range []oci.User{{UID: 1000, GID: 1000}, {UID: 0, GID: 0}} {
		c := &oci.Spec{Process: &oci.Process{User: user}, Linux: &oci.Linux{}}
		if err := cditest.InjectInto(dir, c, ids...); err != nil {
			t.Fatal(err)
		}
		want := map[string]fs.FileMode{"rdma_cm": 0o666, "uverbs0": 0o666, "uverbs1": 0o660, "umad0": 0o600, "issm0": 0o600}
		for _, d := range c.Linux.Devices {
			name := filepath.Base(d.Path)
			m, ok := want[name]
			if !ok {
				continue
			}
			delete(want, name)
			if d.FileMode == nil || d.FileMode.Perm() != m {
				t.Errorf("user %d: %s mode %v, want the host's %v", user.UID, name, d.FileMode, m)
			}
			switch {
			case user.UID == 0 && (d.UID != nil || d.GID != nil):
				t.Errorf("root container: %s owned by %v:%v, want the runtime's default (root)", name, d.UID, d.GID)
			case user.UID != 0 && (d.UID == nil || *d.UID != user.UID || d.GID == nil || *d.GID != user.GID):
				t.Errorf("user %d: %s owned by %v:%v, want the container's user", user.UID, name, d.UID, d.GID)
			}
		}
		if len(want) > 0 {
			t.Errorf("user %d: no device for %v (HCA %s)", user.UID, want, h.Name)
		}
	}
}
