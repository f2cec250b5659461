package e2e

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/test/node"
)

// parallel: every test with a real node or a control plane calls
// t.Parallel (make test-e2e runs -parallel 4); Go starts them once the
// few plain tests have ended, in the order of the files. Each has its own
// control plane, node (kubelet, containerd, namespaces, cgroups, hook
// directory) and ports, and nothing they assert depends on running alone
// or asserts a duration. They mostly wait on kubelets, containers and API
// servers: one after another the suite used a fifth of the machine's CPU.
// Measured with go test ./... of this module (load 4-8, two cores): 576 s
// with the real nodes one at a time and two at a time after them, 283 s
// with all of them four at a time (TestRealNodeRestartChaos, first in
// file order, is then the longest at 283 s).

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
