package prepbench

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/rdma-dra/rdma-dra-driver/internal/atomicfile"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

// floorDriver is the least a DRA driver does for a prepare (as
// pkg/draplugin's BenchmarkPrepareVsFloor has it): the helper GETs the
// claim, the driver writes one fsync'd file (its checkpoint) and answers
// with one CDI device; unprepare removes the file.
type floorDriver struct{ dir string }

var _ kubeletplugin.DRAPlugin = floorDriver{}

func (f floorDriver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		if err := atomicfile.Write(filepath.Join(f.dir, string(c.UID)), []byte(c.Name)); err != nil {
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		r := c.Status.Allocation.Devices.Results[0]
		out[c.UID] = kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{driverName + "/hca=" + string(c.UID)},
		}}}
	}
	return out, nil
}

func (f floorDriver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = os.Remove(filepath.Join(f.dir, string(c.UID)))
	}
	return out, nil
}

func (floorDriver) HandleError(context.Context, error, string) {}

func (floorDriver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// startFloor serves floorDriver in this process from dir, through the
// same helper the daemon uses, with the control plane's client (QPS 500,
// burst 1000: never the limit here). It registers under its own socket
// name and publishes nothing.
func startFloor(b *testing.B, cp *cluster.ControlPlane, dir, registry string) drapb.DRAPluginClient {
	b.Helper()
	state, plugin := filepath.Join(dir, "state"), filepath.Join(dir, "plugin")
	for _, d := range []string{state, plugin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	helper, err := kubeletplugin.Start(ctx, floorDriver{state},
		kubeletplugin.DriverName(driverName), kubeletplugin.NodeName(nodeName), kubeletplugin.KubeClient(cp.Client),
		kubeletplugin.PluginDataDirectoryPath(plugin), kubeletplugin.RegistrarDirectoryPath(registry),
		kubeletplugin.RegistrarSocketFilename("floor-reg.sock"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(helper.Stop)
	return drapb.NewDRAPluginClient(dial(b, filepath.Join(plugin, "dra.sock")))
}
