// Package drafloor is the least a DRA driver does for a prepare: the
// floor the driver's prepare is benchmarked against. The kubeletplugin
// helper GETs each claim; Driver writes one fsync'd file per claim (a
// checkpoint's worth of durability) and answers with one CDI device;
// unprepare removes the file. It ships in no binary: the benchmarks of
// pkg/draplugin run it in their process, test/prepbench as its own process
// (test/cmd/rdma-floor-driver), as the daemon runs.
package drafloor

import (
	"context"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/rdma-dra/rdma-dra-driver/internal/atomicfile"
)

// Driver is the minimal kubeletplugin.DRAPlugin. Dir must exist.
type Driver struct {
	Dir string
	// CDIKind prefixes the CDI device ID it returns ("rdma.dra.dev/hca").
	CDIKind string
}

var _ kubeletplugin.DRAPlugin = Driver{}

func (f Driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		if err := atomicfile.Write(filepath.Join(f.Dir, string(c.UID)), []byte(c.Name)); err != nil {
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		r := c.Status.Allocation.Devices.Results[0]
		out[c.UID] = kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{f.CDIKind + "=" + string(c.UID)},
		}}}
	}
	return out, nil
}

func (f Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = os.Remove(filepath.Join(f.Dir, string(c.UID)))
	}
	return out, nil
}

func (Driver) HandleError(context.Context, error, string) {}

func (Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
