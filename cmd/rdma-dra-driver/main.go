// Command rdma-dra-driver is the node daemon: it discovers the node's RDMA
// HCAs, publishes them as ResourceSlices and serves the kubelet's DRA gRPC.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/internal/buildinfo"
)

func main() {
	o := &options{logging: logsapi.NewLoggingConfiguration()}
	fs := pflag.NewFlagSet("rdma-dra-driver", pflag.ContinueOnError)
	o.addFlags(fs)
	logsapi.AddFlags(o.logging, fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if o.printVersion {
		fmt.Println("rdma-dra-driver", buildinfo.Get())
		os.Exit(0)
	}
	if err := run(o, fs); err != nil {
		klog.Background().Error(err, "rdma-dra-driver failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

// run configures the process from its flags and environment, builds the
// driver, starts the kubelet plugin and the HTTP endpoints, and serves
// until SIGTERM.
func run(o *options, fs *pflag.FlagSet) (err error) {
	if err := applyEnvironment(fs); err != nil {
		return err
	}
	if err := applyLogging(o); err != nil {
		return err
	}
	defer logs.FlushLogs()
	if o.nodeName == "" {
		return errors.New("--node-name (NODE_NAME) is required")
	}
	if err := validateModes(o); err != nil {
		return err
	}
	if err := pinHook(o); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.Background().WithValues("node", o.nodeName, "driver", o.driverName)
	build := buildinfo.Get()
	logger.Info("Starting rdma-dra-driver", "version", build.Version, "commit", build.Commit, "goVersion", build.GoVersion)
	// A SIGTERM while starting (waiting for an informer, say) is a clean
	// stop, not a failure.
	defer func() {
		if err != nil && ctx.Err() != nil {
			logger.Info("Stopped during start-up", "cause", context.Cause(ctx), "interrupted", err)
			err = nil
		}
	}()
	ctx = klog.NewContext(ctx, logger)

	gate := newCallGate()
	clients, err := newClients(o, gate)
	if err != nil {
		return err
	}
	dirs := o.dirs()
	dmn, err := newDaemon(ctx, o, clients, dirs, build)
	if err != nil {
		return err
	}
	defer dmn.close()
	dmn.startShim(ctx, o, stop)

	helper, err := startPlugin(ctx, o, clients.helperClient(), gate, dmn.driver, dirs)
	if err != nil {
		return err
	}
	// On the way out: the call in flight finishes and answers (Drain),
	// then the helper stops, cancelling calls that came after.
	defer helper.Stop()
	defer dmn.driver.Drain(200 * time.Millisecond) // the last answer's time to reach the kubelet
	if err := dmn.driver.SetPublisher(ctx, helper); err != nil {
		return err
	}

	go newForeignAdvertiser(dmn.nodes, o, dmn.metrics.Registry).run(ctx, foreignCheckInterval)

	servers := startHTTP(ctx, o, dmn.metrics, helper, dirs.plugin)
	defer stopHTTP(servers)

	logger.Info("Driver started", "pluginDir", dirs.plugin, "cdiRoot", o.cdiRoot, "state", dirs.state)
	dmn.driver.Run(ctx)
	logger.Info("Shutting down", "cause", context.Cause(ctx))
	return nil
}
