package guest

// What a process in another network namespace sees, in both RDMA netns
// modes, on the real kernel against the simulator's ForeignNetns view of
// the same node: discovery (sysfs remounted in the namespace, RDMA netlink
// from it) must give the same inventory for both.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

const helperEnv = "RDMA_DRA_VM_HELPER"

// netnsView is what the helper reports from inside the namespace.
type netnsView struct {
	Inventory    hca.Inventory
	IBClass      []string // class/infiniband
	VerbsClass   []string // class/infiniband_verbs
	MountedSysfs bool
}

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "netns-discover":
		os.Exit(netnsHelper())
	case "uverbs-contexts":
		os.Exit(uverbsContextsHelper())
	case "uverbs-reg-mr":
		os.Exit(regMRHelper())
	case "pod-owner":
		os.Exit(podOwnerHelper())
	case "pod-sidecar":
		os.Exit(podSidecarHelper())
	}
	os.Exit(m.Run())
}

// netnsHelper runs in a new network and mount namespace: it mounts that
// namespace's sysfs on /sys and discovers from it.
func netnsHelper() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 1 }
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fail(fmt.Errorf("making / private: %w", err))
	}
	if err := syscall.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		return fail(fmt.Errorf("mounting the namespace's sysfs: %w", err))
	}
	v := netnsView{MountedSysfs: true}
	var err error
	if v.Inventory, err = hca.NewDiscoverer(hca.WithNetlink(hca.HostNetlink("/sys"))).Discover(); err != nil {
		return fail(err)
	}
	for dir, dst := range map[string]*[]string{"/sys/class/infiniband": &v.IBClass, "/sys/class/infiniband_verbs": &v.VerbsClass} {
		es, _ := os.ReadDir(dir)
		for _, e := range es {
			*dst = append(*dst, e.Name())
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(v); err != nil {
		return fail(err)
	}
	return 0
}

func setNetnsMode(mode string) error {
	// The mode can change only while no other network namespace exists;
	// a helper's may take a moment to go.
	return poll.Until(context.Background(), "rdma system set netns "+mode, 100*time.Millisecond, 5*time.Second, func(context.Context) (bool, string, error) {
		out, err := exec.Command("rdma", "system", "set", "netns", mode).CombinedOutput()
		if err != nil {
			return false, fmt.Sprintf("%v: %s", err, strings.TrimSpace(string(out))), nil
		}
		return true, "", nil
	})
}

func TestForeignNetnsViewMatchesSimulator(t *testing.T) {
	inGuest(t)
	if ok, why := siwBuilt(); !ok {
		t.Skipf("the vm preset includes siw0: %s", why)
	}
	t.Cleanup(func() {
		if err := setNetnsMode("shared"); err != nil {
			t.Errorf("restoring shared netns mode: %v", err)
		}
	})
	for _, mode := range []string{"shared", "exclusive"} {
		t.Run(mode, func(t *testing.T) {
			if err := setNetnsMode(mode); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("/proc/self/exe", "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"=netns-discover")
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("discovery in a new network namespace: %v\n%s", err, stderr.String())
			}
			var real netnsView
			if err := json.Unmarshal(out, &real); err != nil {
				t.Fatalf("helper output: %v\n%s", err, out)
			}

			spec, err := hcatest.Preset("vm")
			if err != nil {
				t.Fatal(err)
			}
			spec.ForeignNetns, spec.NetnsShared = true, mode == "shared"
			dir := t.TempDir()
			sim, err := hcatest.Build(dir, spec)
			if err != nil {
				t.Fatal(err)
			}
			simInv, err := hca.NewDiscoverer(hca.WithSysfsRoot(sim.SysfsRoot), hca.WithDevRoot(sim.DevRoot),
				hca.WithReadFile(sim.ReadFile), hca.WithNetlink(sim.Netlink())).Discover()
			if err != nil {
				t.Fatal(err)
			}
			// Both through JSON, as the real one came.
			b, _ := json.Marshal(simInv)
			var simRT hca.Inventory
			_ = json.Unmarshal(b, &simRT)
			if !reflect.DeepEqual(simRT, real.Inventory) {
				t.Errorf("discovery from another network namespace (%s mode):\n  simulator %+v\n  kernel    %+v", mode, simRT, real.Inventory)
			}
			t.Logf("%s mode, another netns: class/infiniband %v, class/infiniband_verbs %v, %d HCAs, warnings %q",
				mode, real.IBClass, real.VerbsClass, len(real.Inventory.HCAs), real.Inventory.Warnings)
			if mode == "exclusive" && len(real.IBClass) != 0 {
				t.Errorf("exclusive mode: another namespace's class/infiniband lists %v", real.IBClass)
			}
		})
	}
}
