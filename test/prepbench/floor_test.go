package prepbench

import (
	"os"
	"path/filepath"
	"testing"

	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

// startFloor runs the minimal driver (internal/drafloor, as the command
// test/cmd/rdma-floor-driver) from dir against the control plane, as its
// own process like the daemon: a floor in the benchmark's process would
// skip the trips between processes the daemon pays. It registers under
// its own socket name and publishes nothing.
func startFloor(b *testing.B, w *world, dir, registry string) drapb.DRAPluginClient {
	b.Helper()
	state, plugin := filepath.Join(dir, "state"), filepath.Join(dir, "plugin")
	for _, d := range []string{state, plugin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	binary, err := cluster.BuildTestCommand(dir, "rdma-floor-driver")
	if err != nil {
		b.Fatal(err)
	}
	p, err := cluster.StartProcess(binary, "--kubeconfig="+w.cp.Kubeconfig, "--node-name="+nodeName, "--driver-name="+driverName,
		"--state-dir="+state, "--plugin-dir="+plugin, "--registry-dir="+registry, "--registrar-socket=floor-reg.sock")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("minimal driver's logs:\n%s", p.Logs())
		}
		p.Kill()
	})
	return register(b, p, filepath.Join(registry, "floor-reg.sock"))
}
