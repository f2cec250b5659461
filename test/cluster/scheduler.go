package cluster

import (
	"context"
	"fmt"
	"strings"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler"
	"k8s.io/kubernetes/pkg/scheduler/profile"
)

// StartScheduler runs kube-scheduler's scheduler with the default profile
// until ctx ends; it returns once its informers and event handlers have
// synced. In 1.37 the default profile has the DynamicResources plugin, and
// the feature gates it reads (DynamicResourceAllocation, DRAConsumableCapacity,
// DRAExtendedResource, DRADeviceTaints, DRADeviceTaintRules,
// DRAPartitionableDevices, DRAPrioritizedList) are all on by default, so
// nothing is set here: feature gates are process-global, and setting them
// would leak into every other control plane in the process.
//
// The scheduler's state (caches, queue, DRA manager, informers) is per
// call, so several clusters may each run one. What is global: metrics
// registration (sync.Once in the scheduler's metrics package, so only the
// first scheduler's metrics are exported) and a SIGUSR2 handler per
// scheduler that dumps its cache.
func StartScheduler(ctx context.Context, cp *ControlPlane) error {
	if err := checkFeatures(); err != nil {
		return err
	}
	logger := klog.LoggerWithName(klog.FromContext(ctx), "scheduler")
	ctx = klog.NewContext(ctx, logger)

	cfg := cp.componentConfig("kube-scheduler")
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// Scheduler's own informer factory: its pod informer skips terminal pods.
	factory := scheduler.NewInformerFactory(client, 0, nil)

	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	sched, err := scheduler.New(ctx, client, factory, nil,
		profile.NewRecorderFactory(broadcaster),
		scheduler.WithKubeConfig(cfg),
	)
	if err != nil {
		broadcaster.Shutdown()
		return fmt.Errorf("creating the scheduler: %w", err)
	}
	broadcaster.StartRecordingToSink(ctx.Done())

	factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		broadcaster.Shutdown()
		factory.Shutdown()
	}()

	syncCtx, cancel := context.WithTimeout(ctx, componentTimeout)
	defer cancel()
	for typ, ok := range factory.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			return fmt.Errorf("scheduler: informer for %v did not sync", typ)
		}
	}
	if err := sched.WaitForHandlersSync(syncCtx); err != nil {
		return fmt.Errorf("scheduler: event handlers did not sync: %w", err)
	}
	go sched.Run(ctx)
	return nil
}

// schedulerFeatures are the feature gates our scenarios rely on. All are on
// by default in 1.37; the scheduler, the API server and the controllers of
// this process all read the one global gate.
var schedulerFeatures = []featuregate.Feature{
	features.DynamicResourceAllocation,
	features.DRAConsumableCapacity,   // shared devices (allowMultipleAllocations, capacity)
	features.DRAExtendedResource,     // DeviceClass extendedResourceName
	features.DRADeviceTaints,         // device taints in slices
	features.DRADeviceTaintRules,     // DeviceTaintRule objects
	features.DRAPartitionableDevices, // counters
	features.DRAPrioritizedList,      // firstAvailable
}

// checkFeatures fails if a gate we need is off: changing process-global
// gates here would silently change every other cluster in the process.
func checkFeatures() error {
	var off []string
	for _, f := range schedulerFeatures {
		if !utilfeature.DefaultFeatureGate.Enabled(f) {
			off = append(off, string(f))
		}
	}
	if len(off) > 0 {
		return fmt.Errorf("feature gates off in this process: %s", strings.Join(off, ", "))
	}
	return nil
}
