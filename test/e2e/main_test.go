package e2e

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/test/node"
)

// parallel: the package's tests run one after another, but for those that
// call t.Parallel, which Go starts once every other test has ended,
// -parallel (GOMAXPROCS, 2 on CI) at a time, in the order of the files:
//   - TestRealNodeRestartChaos and TestRealNodeScenarios, the two longest
//     (235 and 178 s of the suite's 945 s at load 8-15), each with its own
//     real node (control plane, kubelet, containerd, namespaces, cgroups,
//     hook directory and ports its own);
//   - the tests without a node (a control plane, a bare daemon; every
//     directory and port their own), which mostly wait on their API server
//     and daemon.
//
// The suite used a fifth of the machine's CPU (260 s over 11 minutes on
// two cores): its tests wait on kubelets, containers and API servers, and
// side by side they wait at once (945 s before, 563 s after). Nothing they assert depends on running
// alone, and nothing asserts a duration: real nodes already run beside
// each other when the test module's packages (test/node and this one) do.

// TestMain removes what the package's tests share (the driver's image)
// after they ran.
func TestMain(m *testing.M) {
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// shared is built once per test process and used by every test that
// needs it: `make image` of this tree is the same for all of them, and
// took 8-24 s a test (a link of every binary and a 30 MB tarball).
var shared struct {
	once  sync.Once
	dir   string
	image string // the driver's image tarball, from `make image`
	err   error
}

// driverImage is the tarball `make image` builds from this tree, built by
// the first test that asks; each node imports it into its own containerd.
func driverImage(t *testing.T) string {
	t.Helper()
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "rdma-e2e-image"); shared.err != nil {
			return
		}
		shared.image, shared.err = node.BuildDriverImage(shared.dir)
	})
	if shared.err != nil {
		t.Fatal(fmt.Errorf("the driver's image: %w", shared.err))
	}
	return shared.image
}
