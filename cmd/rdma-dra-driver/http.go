package main

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-base/metrics"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
)

func startHTTP(ctx context.Context, o *options, m *draplugin.Metrics, helper *kubeletplugin.Helper, pluginDir string) []*http.Server {
	logger := klog.FromContext(ctx)
	var servers []*http.Server
	serve := func(addr string, mux *http.ServeMux) {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			logger.Error(err, "Cannot listen", "address", addr)
			return
		}
		s := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		servers = append(servers, s)
		go func() { _ = s.Serve(l) }()
		logger.Info("Serving HTTP", "address", l.Addr().String())
	}
	if o.metricsAddress != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.HandlerFor(m.Registry, metrics.HandlerOpts{}))
		serve(o.metricsAddress, mux)
	}
	if o.healthzAddress != "" {
		check := &socketCheck{
			registrationSocket: filepath.Join(o.kubeletRootDir, "plugins_registry", o.driverName+"-reg.sock"),
			draSocket:          filepath.Join(pluginDir, draSocketName(o.podUID)),
			helper:             helper,
		}
		if o.podUID != "" {
			dir := filepath.Join(o.kubeletRootDir, "plugins_registry")
			check.registrationSocket = filepath.Join(dir, kubeletplugin.RollingUpdateRegistrarSocketFile(dir, o.driverName, types.UID(o.podUID)))
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", check.serveHealthz)
		mux.HandleFunc("/readyz", check.serveReadyz)
		serve(o.healthzAddress, mux)
	}
	return servers
}

// stopHTTP shuts the servers down, giving each 5 seconds.
func stopHTTP(servers []*http.Server) {
	for _, s := range servers {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.Shutdown(shutdownCtx)
		cancel()
	}
}
