package guest

// The simulator against the kernel it imitates: hcatest's "vm" preset is
// this guest (rxe0 on eth0, rxe1 on eth1, siw0 on eth0). Its sysfs tree,
// device nodes and RDMA netlink answers are compared with the real ones,
// file by file, and discovery must see the same inventory in both.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// realOnly are entries of the kernel's device directories the simulator
// need not write: nothing reads them.
var realOnly = []string{"power", "uevent", "hw_counters", "cm_rx_duplicates", "cm_rx_msgs", "cm_tx_msgs", "cm_tx_retries",
	"subsystem", "counters"}

func TestSimulatorVMPresetMatchesKernel(t *testing.T) {
	inGuest(t)
	if ok, why := siwBuilt(); !ok {
		t.Skipf("the vm preset includes siw0: %s", why)
	}
	spec, err := hcatest.Preset("vm")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/tmp", "sim-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sim, err := hcatest.Build(dir, spec)
	if err != nil {
		t.Fatal(err)
	}

	var diffs []string
	diff := func(format string, args ...any) { diffs = append(diffs, fmt.Sprintf(format, args...)) }
	for _, class := range []string{"infiniband", "infiniband_verbs", "infiniband_mad"} {
		simClass := filepath.Join(sim.SysfsRoot, "class", class)
		entries, err := os.ReadDir(simClass)
		if err != nil {
			t.Fatalf("simulated class %s: %v", class, err)
		}
		realEntries, _ := os.ReadDir("/sys/class/" + class)
		if a, b := names(entries), names(realEntries); !reflect.DeepEqual(a, b) {
			diff("class/%s: simulator %v, kernel %v", class, a, b)
		}
		for _, e := range entries {
			rel := filepath.Join("class", class, e.Name())
			compareEntry(sim, rel, diff)
			if e.Type()&fs.ModeSymlink != 0 {
				compareTree(t, sim, rel, diff)
			}
		}
	}
	compareEntry(sim, "module/ib_core/parameters/netns_mode", diff)

	// Device nodes: names and numbers.
	simDev, _ := os.ReadDir(filepath.Join(sim.DevRoot, "infiniband"))
	realDev, _ := os.ReadDir("/dev/infiniband")
	if a, b := names(simDev), names(realDev); !reflect.DeepEqual(a, b) {
		diff("/dev/infiniband: simulator %v, kernel %v", a, b)
	}
	for _, e := range simDev {
		var s, r syscall.Stat_t
		if syscall.Stat(filepath.Join(sim.DevRoot, "infiniband", e.Name()), &s) == nil &&
			syscall.Stat("/dev/infiniband/"+e.Name(), &r) == nil && sim.CharDevices && s.Rdev != r.Rdev {
			diff("/dev/infiniband/%s: simulator rdev %#x, kernel %#x", e.Name(), s.Rdev, r.Rdev)
		}
	}

	// RDMA netlink.
	simLinks, err1 := sim.Netlink().Links()
	realLinks, err2 := rdmanl.Client{}.Links()
	if err1 != nil || err2 != nil || !reflect.DeepEqual(simLinks, realLinks) {
		diff("rdma netlink links: simulator %+v (%v), kernel %+v (%v)", simLinks, err1, realLinks, err2)
	}
	simMode, err1 := sim.Netlink().NetnsMode()
	realMode, err2 := rdmanl.Client{}.NetnsMode()
	if err1 != nil || err2 != nil || simMode != realMode {
		diff("rdma netlink netns mode: simulator %v (%v), kernel %v (%v)", simMode, err1, realMode, err2)
	}

	// Discovery sees the same node in both.
	simInv, err := hca.NewDiscoverer(hca.WithSysfsRoot(sim.SysfsRoot), hca.WithDevRoot(sim.DevRoot),
		hca.WithReadFile(sim.ReadFile), hca.WithNetlink(sim.Netlink())).Discover()
	if err != nil {
		t.Fatal(err)
	}
	realInv, err := hca.NewDiscoverer(hca.WithNetlink(hca.HostNetlink("/sys"))).Discover()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(simInv, realInv) {
		diff("discovery differs:\n  simulator %+v\n  kernel    %+v", simInv, realInv)
	}

	for _, d := range diffs {
		t.Errorf("simulator vs kernel: %s", d)
	}
}

func names(es []os.DirEntry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// compareEntry compares one path (relative to sysfs) of both trees: its
// type, a symlink's target, a file's content or read error.
func compareEntry(sim *hcatest.Node, rel string, diff func(string, ...any)) {
	sp, rp := filepath.Join(sim.SysfsRoot, rel), filepath.Join("/sys", rel)
	si, err := os.Lstat(sp)
	if err != nil {
		diff("%s: simulator: %v", rel, err)
		return
	}
	ri, err := os.Lstat(rp)
	if err != nil {
		diff("%s: in the simulator, not in the kernel (%v)", rel, err)
		return
	}
	if si.Mode().Type() != ri.Mode().Type() {
		diff("%s: simulator %v, kernel %v", rel, si.Mode().Type(), ri.Mode().Type())
		return
	}
	switch {
	case si.Mode()&fs.ModeSymlink != 0:
		st, _ := os.Readlink(sp)
		rt, _ := os.Readlink(rp)
		if st != rt {
			diff("%s: simulator -> %s, kernel -> %s", rel, st, rt)
		}
	case si.Mode().IsRegular():
		if ri.Mode().Perm()&0o444 == 0 {
			return
		}
		sb, serr := sim.ReadFile(sp)
		rb, rerr := os.ReadFile(rp)
		switch {
		case serr != nil || rerr != nil:
			if !sameErr(serr, rerr) {
				diff("%s: simulator read %q (%v), kernel read %q (%v)", rel, trim(sb), serr, trim(rb), rerr)
			}
		case trim(sb) != trim(rb):
			diff("%s: simulator %q, kernel %q", rel, trim(sb), trim(rb))
		}
	}
}

func trim(b []byte) string { return strings.TrimSpace(string(b)) }

func sameErr(a, b error) bool {
	var ea, eb syscall.Errno
	return errors.As(a, &ea) && errors.As(b, &eb) && ea == eb
}

// compareTree compares the device directory behind a class link, both
// ways: what the simulator writes must be in the kernel's; what only the
// kernel has is reported unless nothing reads it (realOnly).
func compareTree(t *testing.T, sim *hcatest.Node, rel string, diff func(string, ...any)) {
	t.Helper()
	base := rel + "/"
	seen := map[string]bool{}
	_ = filepath.WalkDir(filepath.Join(sim.SysfsRoot, rel)+"/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			diff("%s: simulator walk: %v", p, err)
			return nil
		}
		r := strings.TrimPrefix(p, filepath.Join(sim.SysfsRoot, rel)+"/")
		if r == "" || r == p {
			return nil
		}
		seen[r] = true
		compareEntry(sim, base+r, diff)
		return nil
	})
	_ = filepath.WalkDir("/sys/"+rel+"/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		r := strings.TrimPrefix(p, "/sys/"+rel+"/")
		if r == "" || r == p {
			return nil
		}
		for _, skip := range realOnly {
			if filepath.Base(r) == skip || strings.HasPrefix(r, skip+"/") || strings.Contains(r, "/"+skip+"/") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		if !seen[r] {
			diff("%s%s: in the kernel, not in the simulator", base, r)
		}
		return nil
	})
	t.Logf("%s: %d entries compared", rel, len(seen))
}
