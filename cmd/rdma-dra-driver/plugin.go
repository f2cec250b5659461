package main

import (
	"context"
	"fmt"

	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// startPlugin starts the kubelet plugin helper: the DRA gRPC service and
// the registration with the kubelet.
// The gate counts its prepare and unprepare calls.
func startPlugin(ctx context.Context, o *options, client kubernetes.Interface, gate *callGate, d *draplugin.Driver, dirs daemonDirs) (*kubeletplugin.Helper, error) {
	helperOpts := []kubeletplugin.Option{
		kubeletplugin.GRPCInterceptor(gate.interceptor),
		kubeletplugin.DriverName(o.driverName),
		kubeletplugin.NodeName(o.nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(dirs.plugin),
		kubeletplugin.RegistrarDirectoryPath(dirs.registry),
		// The driver orders the calls itself (pkg/draplugin/claims.go):
		// prepares of different claims run in parallel, also across the
		// old and the new daemon of a rolling update, which share the
		// checkpoint and its file lock.
		kubeletplugin.Serialize(false),
	}
	if o.podUID != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(types.UID(o.podUID)))
	}
	helperOpts = append(helperOpts, kubeletplugin.PluginSocket(draSocketName(o.podUID)))
	// Device metadata files are the driver's own (pkg/draplugin/metadata.go):
	// the helper's writer fsyncs them, and leaves its temp files on a kill.
	helper, err := kubeletplugin.Start(ctx, d, helperOpts...)
	if err != nil {
		return nil, fmt.Errorf("starting the kubelet plugin: %w", err)
	}
	return helper, nil
}

// draSocketName is set explicitly so the health check dials the socket the
// helper listens on; in rolling-update mode each instance has its own.
func draSocketName(podUID string) string {
	if podUID == "" {
		return "dra.sock"
	}
	return "dra-" + podUID + ".sock"
}
