// Command rdma-floor-driver serves internal/drafloor's minimal driver
// through the kubeletplugin helper, as its own process: test/prepbench
// compares the daemon, a process, with it, so both pay the same trips
// between processes. It runs until SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/rdma-dra/rdma-dra-driver/internal/drafloor"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rdma-floor-driver:", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	node := flag.String("node-name", "", "the node's name")
	driver := flag.String("driver-name", "rdma.dra.dev", "the DRA driver name")
	state := flag.String("state-dir", "", "where the per-claim files go (must exist)")
	plugin := flag.String("plugin-dir", "", "the plugin data directory (the dra.sock socket)")
	registry := flag.String("registry-dir", "", "the kubelet's plugin registry directory")
	socket := flag.String("registrar-socket", "floor-reg.sock", "the registration socket's file name")
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	// Never the limit here: the floor is the driver's least work.
	cfg.QPS, cfg.Burst = 500, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, drafloor.Driver{Dir: *state, CDIKind: *driver + "/hca"},
		kubeletplugin.DriverName(*driver), kubeletplugin.NodeName(*node), kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(*plugin), kubeletplugin.RegistrarDirectoryPath(*registry),
		kubeletplugin.RegistrarSocketFilename(*socket))
	if err != nil {
		return err
	}
	<-ctx.Done()
	helper.Stop()
	return nil
}
