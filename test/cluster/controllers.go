package cluster

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/cache"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
	"k8s.io/kubernetes/pkg/controller/job"
	namespacecontroller "k8s.io/kubernetes/pkg/controller/namespace"
	"k8s.io/kubernetes/pkg/controller/nodelifecycle"
	"k8s.io/kubernetes/pkg/controller/podgc"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
)

// componentTimeout bounds how long a Start function waits for its informers.
const componentTimeout = 2 * time.Minute

// componentConfig is cp.Config with its own user agent and a high rate
// limit: each component gets a fresh client, as in kube-controller-manager.
func (cp *ControlPlane) componentConfig(userAgent string) *rest.Config {
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 100, 200
	rest.AddUserAgent(cfg, userAgent)
	return cfg
}

func (cp *ControlPlane) componentClient(userAgent string) (*kubernetes.Clientset, error) {
	return kubernetes.NewForConfig(cp.componentConfig(userAgent))
}

// StartControllers runs, until ctx ends, the parts of kube-controller-manager
// the scenarios need:
//   - resourceclaim: ResourceClaimTemplates become ResourceClaims for pods;
//     reservations of finished pods are removed and their generated claims
//     deleted.
//   - job: Jobs create pods and record completion.
//   - garbagecollector: owner references (pods of deleted Jobs, claims of
//     deleted pods).
//   - nodelifecycle: Ready nodes lose the not-ready taint new nodes get;
//     nodes whose heartbeats stop get tainted.
//   - podgc: deletes pods bound to nodes that no longer exist and
//     terminating pods that were never scheduled.
//   - namespace: deleting a namespace deletes its content.
//
// It returns when every informer, the garbage collector's included, has
// synced (about 0.1–0.9s against a fresh API server); on an error, what
// was started keeps running until ctx ends. Everything built here is per call: several control planes may
// run in one process, one after the other or at the same time (metrics
// registration in these packages is guarded by sync.Once; the first
// call's collectors are the ones exported).
func StartControllers(ctx context.Context, cp *ControlPlane) error {
	logger := klog.LoggerWithName(klog.FromContext(ctx), "controllers")
	ctx = klog.NewContext(ctx, logger)
	// named gives each controller its own logger name (they log through
	// the context passed to their constructor and to Run).
	named := func(name string) context.Context {
		return klog.NewContext(ctx, klog.LoggerWithName(logger, name))
	}

	informerClient, err := cp.componentClient("rdma-dra-shared-informers")
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(informerClient, 0)

	// resourceclaim controller, as kube-controller-manager builds it. The
	// PodGroup informer is only instantiated when GenericWorkload or
	// DRAWorkloadResourceClaims is on (both off by default in 1.37).
	claimClient, err := cp.componentClient("resource-claim-controller")
	if err != nil {
		return err
	}
	claimController, err := resourceclaim.NewController(
		klog.FromContext(named("resourceclaim")),
		claimClient,
		factory.Core().V1().Pods(),
		factory.Scheduling().V1beta1().PodGroups(),
		factory.Resource().V1().ResourceClaims(),
		factory.Resource().V1().ResourceClaimTemplates(),
	)
	if err != nil {
		return fmt.Errorf("resourceclaim controller: %w", err)
	}

	// job controller; the Workload/PodGroup informers are only used with
	// the WorkloadWithJob feature (off by default), as in
	// kube-controller-manager's newJobController.
	jobClient, err := cp.componentClient("job-controller")
	if err != nil {
		return err
	}
	jobController, err := job.NewController(named("job"),
		jobClient, factory.Core().V1().Pods(), factory.Batch().V1().Jobs(), nil, nil)
	if err != nil {
		return fmt.Errorf("job controller: %w", err)
	}

	// Node lifecycle: removes the node.kubernetes.io/not-ready taint that
	// admission (TaintNodesByCondition) puts on every new Node once the Node
	// reports Ready, and taints Nodes whose lease and status stop being
	// renewed (kube-controller-manager defaults: unknown after 50s). Pod
	// eviction from tainted Nodes (taint-eviction-controller) is not run.
	nodeClient, err := cp.componentClient("node-controller")
	if err != nil {
		return err
	}
	nodeLifecycle, err := nodelifecycle.NewNodeLifecycleController(
		named("nodelifecycle"),
		factory.Coordination().V1().Leases(),
		factory.Core().V1().Pods(),
		factory.Core().V1().Nodes(),
		factory.Apps().V1().DaemonSets(),
		nodeClient,
		5*time.Second,       // node monitor period
		60*time.Second,      // node startup grace period
		50*time.Second,      // node monitor grace period
		0.1, 0.01, 50, 0.55, // eviction rates and thresholds, as kube-controller-manager
	)
	if err != nil {
		return fmt.Errorf("node lifecycle controller: %w", err)
	}

	podGCClient, err := cp.componentClient("pod-garbage-collector")
	if err != nil {
		return err
	}
	podGC := podgc.NewPodGC(named("podgc"),
		podGCClient, factory.Core().V1().Pods(), factory.Core().V1().Nodes(), 12500)

	nsConfig := cp.componentConfig("namespace-controller")
	nsClient, err := kubernetes.NewForConfig(nsConfig)
	if err != nil {
		return err
	}
	nsMetadata, err := metadata.NewForConfig(nsConfig)
	if err != nil {
		return err
	}
	nsController := namespacecontroller.NewNamespaceController(
		named("namespace"),
		nsClient, nsMetadata, nsClient.Discovery().ServerPreferredNamespacedResources,
		factory.Core().V1().Namespaces(), 5*time.Minute, v1.FinalizerKubernetes)

	// Garbage collector: typed informers where the shared factory has them,
	// metadata informers for everything else, as in
	// kube-controller-manager's CreateControllerContext.
	gcConfig := cp.componentConfig("generic-garbage-collector")
	gcConfig.QPS *= 2
	gcClient, err := kubernetes.NewForConfig(gcConfig)
	if err != nil {
		return err
	}
	gcMetadata, err := metadata.NewForConfig(gcConfig)
	if err != nil {
		return err
	}
	gcDiscovery, err := discovery.NewDiscoveryClientForConfig(gcConfig)
	if err != nil {
		return err
	}
	metadataFactory := metadatainformer.NewSharedInformerFactory(gcMetadata, 0)
	restMapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(gcDiscovery))
	informersStarted := make(chan struct{})
	gcCtx := named("garbagecollector")
	gc, err := garbagecollector.NewGarbageCollector(gcCtx, gcClient, gcMetadata, restMapper,
		garbagecollector.DefaultIgnoredResources(),
		informerfactory.NewInformerFactory(factory, metadataFactory), informersStarted)
	if err != nil {
		return fmt.Errorf("garbage collector: %w", err)
	}

	factory.Start(ctx.Done())
	metadataFactory.Start(ctx.Done())
	close(informersStarted)
	go func() {
		<-ctx.Done()
		factory.Shutdown()
		metadataFactory.Shutdown()
	}()

	// How often discovery is re-read (new CRDs get GC monitors).
	const discoveryPeriod = 10 * time.Second
	go wait.Until(restMapper.Reset, discoveryPeriod, ctx.Done())
	go claimController.Run(named("resourceclaim"), 10)
	go jobController.Run(named("job"), 5)
	go podGC.Run(named("podgc"))
	go nodeLifecycle.Run(named("nodelifecycle"))
	go nsController.Run(named("namespace"), 5)
	go gc.Run(gcCtx, 5, componentTimeout)
	go gc.Sync(gcCtx, gcDiscovery, discoveryPeriod)

	syncCtx, cancel := context.WithTimeout(ctx, componentTimeout)
	defer cancel()
	for typ, ok := range factory.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			return fmt.Errorf("controllers: informer for %v did not sync", typ)
		}
	}
	// The GC creates its monitors on its first discovery (in Sync) and
	// reports synced once all of them have listed.
	if !cache.WaitForCacheSync(syncCtx.Done(), func() bool { return gc.IsSynced(logger) }) {
		return fmt.Errorf("controllers: garbage collector did not sync: %w", context.Cause(syncCtx))
	}
	return nil
}
