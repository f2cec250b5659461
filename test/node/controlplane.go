package node

import (
	"context"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

// StartControlPlane starts, in this process, the cluster a real node joins:
// etcd and the kube-apiserver with ControlPlaneOptions under dir, the
// controllers, the node controllers and the scheduler. They end when ctx
// does or, at the latest, at tb's cleanup, before the API server stops.
func StartControlPlane(ctx context.Context, tb cluster.TB, dir string) (*cluster.ControlPlane, error) {
	cp, err := cluster.StartControlPlaneWith(tb, dir, ControlPlaneOptions())
	if err != nil {
		return nil, err
	}
	tb.Cleanup(cp.Stop)
	ctx, cancel := context.WithCancel(ctx)
	tb.Cleanup(cancel) // runs first: the components stop before the API server
	for _, start := range []func(context.Context, *cluster.ControlPlane) error{cluster.StartControllers, cluster.StartNodeControllers, cluster.StartScheduler} {
		if err := start(ctx, cp); err != nil {
			return nil, err
		}
	}
	return cp, nil
}
