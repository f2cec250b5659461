package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/klog/v2"
	dpapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	dpplugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubeletevents "k8s.io/kubernetes/pkg/kubelet/events"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/utils/clock"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// NodeAgentConfig describes the node a NodeAgent plays the kubelet of.
type NodeAgentConfig struct {
	NodeName string
	// KubeletDir is the driver's --kubelet-root-dir: the agent watches
	// plugins_registry/ under it (as the kubelet does), serves
	// device-plugins/kubelet.sock and keeps the DRA manager's checkpoint
	// (dra_manager_state) in it.
	KubeletDir string
	// CDIDir is the driver's --cdi-root: container edits are read from it.
	CDIDir string
	// RuncRoot is runc's --root; BundleDir holds one bundle per container
	// (<BundleDir>/<pod UID>-<container>) and the pods' emptyDir volumes.
	RuncRoot, BundleDir string
	// Rootfs is the one filesystem every container runs in (from Rootfs):
	// the agent has no images, a container's image is only reported back.
	Rootfs string
	// Allocatable is the Node's cpu, memory and pods (capacity as well);
	// extended resources served by device plugins are added to it.
	Allocatable corev1.ResourceList
	// NoRuntime: containers are not run. Each container's OCI spec is
	// built exactly as for runc (CDI devices injected by the CDI library's
	// cache, env, capabilities, mounts), a short description of its
	// RDMA-relevant parts (see describeSpec) becomes the container's
	// output, and it exits 0. For machines without root or runc: Rootfs,
	// RuncRoot and BundleDir need not be set (emptyDirs are then placed
	// under KubeletDir/pods, but nothing is mounted), and no runc is
	// called. Capabilities this host lacks are kept: the spec is what a
	// real node would give.
	NoRuntime bool
}

// NodeAgent is a kubelet stand-in for one node, built from the kubelet's
// own managers: the DRA manager (pkg/kubelet/cm/dra) prepares a pod's
// ResourceClaims through the plugin that the kubelet's plugin watcher
// (pkg/kubelet/pluginmanager) found in <KubeletDir>/plugins_registry, and
// the kubelet's device-plugin registration server
// (pkg/kubelet/cm/devicemanager/plugin/v1beta1) takes device plugins at
// <KubeletDir>/device-plugins/kubelet.sock. Containers get their CDI
// devices injected by the CDI library's cache, as containerd does, and run
// with runc (with NoRuntime: are only described, see NoRuntime).
//
// What it is not: only restartPolicy Never is honoured (a container runs
// once; the pod ends Succeeded when all containers exit 0, else Failed);
// init containers run one after another, then the app containers at once;
// there are no images (every container runs Rootfs; command+args must name
// a program in it), no probes, no service environment variables, no
// cgroup limits; volumes are emptyDir (Memory: a tmpfs) and hostPath only.
// A pod found Running when the agent starts (a previous agent's) is marked
// Failed: its container cannot be reattached.
type NodeAgent struct {
	cfg         NodeAgentConfig
	client      kubernetes.Interface
	logger      klog.Logger
	ctx         context.Context
	cancel      context.CancelFunc
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	dra         *dra.Manager
	devices     *devicePlugins
	cdi         *cdiapi.Cache
	podLister   corelisters.PodLister
	podsSynced  cache.InformerSynced
	nodeUpdate  chan struct{}
	factory     informers.SharedInformerFactory
	bg          sync.WaitGroup // the agent's own loops
	workers     sync.WaitGroup // pod workers
	stopOnce    sync.Once

	mu   sync.Mutex
	pods map[types.UID]*podWorker
	logs map[string][]byte // namespace/pod/container -> output
}

// StartNodeAgent registers the Node, starts the kubelet's plugin watcher,
// DRA manager and device-plugin server, and runs the pods bound to
// cfg.NodeName until ctx ends or Stop is called.
func StartNodeAgent(ctx context.Context, cp *ControlPlane, cfg NodeAgentConfig) (*NodeAgent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.NoRuntime && cfg.BundleDir == "" {
		cfg.BundleDir = cfg.KubeletDir // emptyDirs in <KubeletDir>/pods/<uid>/volumes, as a kubelet's
	}
	for _, dir := range []string{
		filepath.Join(cfg.KubeletDir, "plugins_registry"),
		filepath.Join(cfg.KubeletDir, "plugins"),
		filepath.Join(cfg.KubeletDir, "device-plugins"),
		cfg.CDIDir, cfg.RuncRoot, cfg.BundleDir,
	} {
		if dir == "" { // RuncRoot with NoRuntime
			continue
		}
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("node agent %s: %w", cfg.NodeName, err)
		}
	}
	cdiCache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cfg.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("node agent %s: CDI cache for %s: %w", cfg.NodeName, cfg.CDIDir, err)
	}

	ctx, cancel := context.WithCancel(ctx)
	logger := klog.LoggerWithValues(klog.LoggerWithName(klog.FromContext(ctx), "node-agent"), "node", cfg.NodeName)
	ctx = klog.NewContext(ctx, logger)
	a := &NodeAgent{
		cfg:        cfg,
		client:     cp.Client,
		logger:     logger,
		ctx:        ctx,
		cancel:     cancel,
		cdi:        cdiCache,
		nodeUpdate: make(chan struct{}, 1),
		pods:       map[types.UID]*podWorker{},
		logs:       map[string][]byte{},
	}
	ok := false
	defer func() {
		if !ok {
			a.Stop()
		}
	}()

	a.broadcaster = record.NewBroadcaster(record.WithContext(ctx))
	a.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	a.recorder = a.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: cfg.NodeName})

	if err := a.registerNode(ctx); err != nil {
		return nil, err
	}

	// Pods bound to this node, as the kubelet's API source sees them.
	a.factory = informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	}))
	factory := a.factory
	podInformer := factory.Core().V1().Pods()
	a.podLister = podInformer.Lister()
	a.podsSynced = podInformer.Informer().HasSynced
	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.podChanged(obj) },
		UpdateFunc: func(_, obj any) { a.podChanged(obj) },
		DeleteFunc: a.podDeleted,
	}); err != nil {
		return nil, err
	}
	sourcesReady := config.NewSourcesReady(func(sets.Set[string]) bool { return a.podsSynced() })

	// The DRA manager and the plugin watcher, wired as in
	// pkg/kubelet/cm/container_manager_linux.go and pkg/kubelet/kubelet.go.
	a.dra, err = dra.NewManager(logger, a.client, cfg.KubeletDir)
	if err != nil {
		return nil, fmt.Errorf("node agent %s: DRA manager: %w", cfg.NodeName, err)
	}
	if err := a.dra.Start(ctx, a.activePods, a.getNode, sourcesReady); err != nil {
		return nil, fmt.Errorf("node agent %s: starting the DRA manager: %w", cfg.NodeName, err)
	}
	a.devices, err = newDevicePlugins(logger, filepath.Join(cfg.KubeletDir, "device-plugins"), a.requestNodeUpdate)
	if err != nil {
		return nil, fmt.Errorf("node agent %s: %w", cfg.NodeName, err)
	}
	plugins := pluginmanager.NewPluginManager(filepath.Join(cfg.KubeletDir, "plugins_registry"), a.recorder)
	plugins.AddHandler(pluginwatcherapi.DRAPlugin, a.dra.GetWatcherHandler())
	plugins.AddHandler(pluginwatcherapi.DevicePlugin, a.devices.server)
	a.goBackground(func() { plugins.Run(ctx, sourcesReady, ctx.Done()) })

	// The node lease, with the kubelet's own lease controller.
	leases := lease.NewController(clock.RealClock{}, a.client, cfg.NodeName, 40, nil, 10*time.Second,
		cfg.NodeName, corev1.NamespaceNodeLease, nil)
	a.goBackground(func() { leases.Run(ctx) })
	a.goBackground(func() { a.nodeStatusLoop(ctx) })
	a.goBackground(func() { a.healthLoop(ctx) })

	factory.Start(ctx.Done())
	for typ, synced := range factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			return nil, fmt.Errorf("node agent %s: informer for %v did not sync", cfg.NodeName, typ)
		}
	}
	logger.V(2).Info("Node agent started", "kubeletDir", cfg.KubeletDir, "cdiDir", cfg.CDIDir)
	ok = true
	return a, nil
}

func (c *NodeAgentConfig) validate() error {
	if c.NodeName == "" {
		return errors.New("node agent: NodeName is empty")
	}
	for name, dir := range map[string]string{"KubeletDir": c.KubeletDir, "CDIDir": c.CDIDir, "RuncRoot": c.RuncRoot, "BundleDir": c.BundleDir, "Rootfs": c.Rootfs} {
		if c.NoRuntime && dir == "" && (name == "RuncRoot" || name == "Rootfs" || name == "BundleDir") {
			continue // not used without a runtime
		}
		if dir == "" || !filepath.IsAbs(dir) {
			return fmt.Errorf("node agent %s: %s %q is not an absolute path", c.NodeName, name, dir)
		}
	}
	// The kubelet's device-plugin server refuses socket paths longer than a
	// sockaddr_un holds; say so here, naming the path.
	if sock := filepath.Join(c.KubeletDir, "device-plugins", "kubelet.sock"); len(sock) > 107 {
		return fmt.Errorf("node agent %s: %s is longer than a unix socket path may be (107 bytes); use a shorter KubeletDir", c.NodeName, sock)
	}
	return nil
}

// Stop ends the agent: running containers are killed, the managers stop.
// Prepared claims stay prepared (as when a kubelet stops): the DRA
// manager's checkpoint in KubeletDir has them for the next agent.
// Containers are killed at once (SIGKILL), without a grace period.
func (a *NodeAgent) Stop() {
	a.stopOnce.Do(func() {
		// Under mu: no pod worker starts after this.
		a.mu.Lock()
		a.cancel()
		a.mu.Unlock()
		a.workers.Wait()
		if a.factory != nil {
			a.factory.Shutdown()
		}
		if a.dra != nil {
			a.dra.Stop()
		}
		if a.devices != nil {
			a.devices.stop()
		}
		a.bg.Wait()
		if a.broadcaster != nil {
			a.broadcaster.Shutdown()
		}
	})
}

// Logs is what the container printed (stdout and stderr), kept after it
// ended; empty until it ended.
func (a *NodeAgent) Logs(namespace, pod, container string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return string(a.logs[namespace+"/"+pod+"/"+container])
}

func (a *NodeAgent) goBackground(f func()) {
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		f()
	}()
}

// --- the Node object ---------------------------------------------------

func (a *NodeAgent) getNode(ctx context.Context) (*corev1.Node, error) {
	return a.client.CoreV1().Nodes().Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
}

// registerNode creates the Node (or takes over an existing one) and
// reports it Ready.
func (a *NodeAgent) registerNode(ctx context.Context) error {
	nodeLabels := map[string]string{
		corev1.LabelHostname:   a.cfg.NodeName,
		corev1.LabelOSStable:   "linux",
		corev1.LabelArchStable: runtime.GOARCH,
	}
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		node, err := a.getNode(ctx)
		if apierrors.IsNotFound(err) {
			_, err = a.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.cfg.NodeName, Labels: nodeLabels}}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("nodes"), a.cfg.NodeName, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		changed := false
		for k, v := range nodeLabels {
			if node.Labels[k] != v {
				if node.Labels == nil {
					node.Labels = map[string]string{}
				}
				node.Labels[k], changed = v, true
			}
		}
		if changed {
			_, err = a.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("node agent: registering node %s: %w", a.cfg.NodeName, err)
	}
	if err := a.updateNodeStatus(ctx); err != nil {
		return fmt.Errorf("node agent: status of node %s: %w", a.cfg.NodeName, err)
	}
	return nil
}

func (a *NodeAgent) requestNodeUpdate() {
	select {
	case a.nodeUpdate <- struct{}{}:
	default:
	}
}

// nodeStatusLoop keeps the Node Ready and its device-plugin capacity
// current: every 10s, and at once when a device plugin reports.
func (a *NodeAgent) nodeStatusLoop(ctx context.Context) {
	ticker := time.NewTicker(10 * time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-a.nodeUpdate:
		}
		if err := a.updateNodeStatus(ctx); err != nil && ctx.Err() == nil {
			a.logger.Error(err, "Updating the node status")
		}
	}
}

func (a *NodeAgent) updateNodeStatus(ctx context.Context) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		node, err := a.getNode(ctx)
		if err != nil {
			return err
		}
		now := metav1.Now()
		capacity, allocatable := a.cfg.Allocatable.DeepCopy(), a.cfg.Allocatable.DeepCopy()
		if capacity == nil {
			capacity, allocatable = corev1.ResourceList{}, corev1.ResourceList{}
		}
		if a.devices != nil {
			devCap, devAlloc := a.devices.capacity()
			for name, q := range devCap {
				capacity[name] = q
			}
			for name, q := range devAlloc {
				allocatable[name] = q
			}
		}
		node.Status.Capacity, node.Status.Allocatable = capacity, allocatable
		node.Status.Phase = corev1.NodeRunning
		node.Status.Addresses = []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
			{Type: corev1.NodeHostName, Address: a.cfg.NodeName},
		}
		node.Status.NodeInfo.OperatingSystem, node.Status.NodeInfo.Architecture = "linux", runtime.GOARCH
		node.Status.NodeInfo.KubeletVersion = "v1.37.2-rdma-dra-node-agent"
		node.Status.NodeInfo.ContainerRuntimeVersion = "runc://"
		setNodeCondition(node, corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "node agent is posting ready status", now)
		setNodeCondition(node, corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "", now)
		setNodeCondition(node, corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "", now)
		setNodeCondition(node, corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "", now)
		_, err = a.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
}

func setNodeCondition(node *corev1.Node, typ corev1.NodeConditionType, status corev1.ConditionStatus, reason, message string, now metav1.Time) {
	for i := range node.Status.Conditions {
		c := &node.Status.Conditions[i]
		if c.Type != typ {
			continue
		}
		if c.Status != status {
			c.LastTransitionTime = now
		}
		c.Status, c.Reason, c.Message, c.LastHeartbeatTime = status, reason, message, now
		return
	}
	node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{
		Type: typ, Status: status, Reason: reason, Message: message, LastHeartbeatTime: now, LastTransitionTime: now,
	})
}

// --- pods --------------------------------------------------------------

// activePods is the DRA manager's view of the pods that may still use
// their claims: those not yet terminal, and those whose worker still runs.
// healthLoop rewrites the status of the pods whose devices changed health,
// as the kubelet's sync loop does on containerManager.Updates().
func (a *NodeAgent) healthLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case u := <-a.dra.Updates():
			for _, uid := range u.PodUIDs {
				a.mu.Lock()
				w := a.pods[types.UID(uid)]
				a.mu.Unlock()
				if w != nil && !w.finished() {
					w.pushStatus()
				}
			}
		}
	}
}

func (a *NodeAgent) activePods() []*corev1.Pod {
	pods, err := a.podLister.List(labels.Everything())
	if err != nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var active []*corev1.Pod
	for _, pod := range pods {
		w := a.pods[pod.UID]
		if !podIsTerminal(pod) || (w != nil && !w.finished()) {
			active = append(active, pod)
		}
	}
	return active
}

func podIsTerminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

func (a *NodeAgent) podChanged(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != a.cfg.NodeName {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.pods[pod.UID]
	if w == nil {
		if a.ctx.Err() != nil {
			return
		}
		w = newPodWorker(a, pod)
		a.pods[pod.UID] = w
		a.workers.Add(1)
		go func() {
			defer a.workers.Done()
			w.run()
		}()
	}
	if pod.DeletionTimestamp != nil {
		w.terminate("pod is being deleted", true)
	}
}

func (a *NodeAgent) podDeleted(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	a.mu.Lock()
	w := a.pods[pod.UID]
	a.mu.Unlock()
	if w == nil {
		return
	}
	w.terminate("pod was deleted", false)
	go func() {
		<-w.done
		a.mu.Lock()
		delete(a.pods, pod.UID)
		a.mu.Unlock()
	}()
}

// currentPod is the latest version of the pod the informer has, nil once
// it is gone (or replaced by another pod of the same name).
func (a *NodeAgent) currentPod(namespace, name string, uid types.UID) *corev1.Pod {
	pod, err := a.podLister.Pods(namespace).Get(name)
	if err != nil || pod.UID != uid {
		return nil
	}
	return pod
}

func (a *NodeAgent) keepLogs(pod *corev1.Pod, container string, out []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.logs[pod.Namespace+"/"+pod.Name+"/"+container] = out
}

// podWorker runs one pod from first sight to the end: prepare its claims,
// run its containers, report status, unprepare.
type podWorker struct {
	a    *NodeAgent
	pod  *corev1.Pod // as first seen: the spec does not change
	ctx  context.Context
	stop context.CancelCauseFunc
	done chan struct{}

	mu       sync.Mutex
	deleting bool // the API server waits for us to delete the pod
	deleted  bool // gone from the API server
	phase    corev1.PodPhase
	reason   string
	message  string
	started  *metav1.Time
	prepared bool
	initDone bool
	initStat []corev1.ContainerStatus
	contStat []corev1.ContainerStatus
}

func newPodWorker(a *NodeAgent, pod *corev1.Pod) *podWorker {
	ctx, stop := context.WithCancelCause(a.ctx)
	w := &podWorker{a: a, pod: pod.DeepCopy(), ctx: ctx, stop: stop, done: make(chan struct{}), phase: corev1.PodPending}
	w.initStat = waitingStatuses(pod.Spec.InitContainers)
	w.contStat = waitingStatuses(pod.Spec.Containers)
	return w
}

func waitingStatuses(containers []corev1.Container) []corev1.ContainerStatus {
	out := make([]corev1.ContainerStatus, len(containers))
	for i, c := range containers {
		out[i] = corev1.ContainerStatus{Name: c.Name, Image: c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
	}
	return out
}

func (w *podWorker) finished() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// terminate kills the pod's containers; with graceful the API server
// keeps the pod until the worker deletes it after cleaning up.
func (w *podWorker) terminate(why string, graceful bool) {
	w.mu.Lock()
	if graceful {
		w.deleting = true
	} else {
		w.deleted = true
	}
	w.mu.Unlock()
	w.stop(errors.New(why))
}

func (w *podWorker) logger() klog.Logger {
	return klog.LoggerWithValues(w.a.logger, "pod", klog.KObj(w.pod), "podUID", w.pod.UID)
}

func (w *podWorker) event(typ, reason, format string, args ...any) {
	w.a.recorder.Eventf(w.pod, typ, reason, format, args...)
}

func (w *podWorker) run() {
	defer close(w.done)
	logger := w.logger()
	pod := w.pod
	switch {
	case podIsTerminal(pod):
		// Ended before this agent started: only make sure nothing stays prepared.
	case pod.Spec.RestartPolicy != "" && pod.Spec.RestartPolicy != corev1.RestartPolicyNever:
		w.fail("RestartPolicyNotSupported", fmt.Sprintf("the node agent runs restartPolicy Never only, not %s", pod.Spec.RestartPolicy))
	case pod.Status.Phase == corev1.PodRunning:
		w.fail("NodeAgentRestarted", "the pod was running under a previous node agent; its containers cannot be reattached")
	default:
		if w.prepare() {
			w.runContainers()
		}
	}
	w.a.devices.release(pod.UID)
	// The pod's emptyDirs go with it.
	if err := os.RemoveAll(filepath.Join(w.a.cfg.BundleDir, "pods", string(pod.UID))); err != nil {
		logger.Error(err, "Removing the pod's volumes")
	}
	w.unprepare()
	w.mu.Lock()
	deleting, deleted := w.deleting, w.deleted
	w.mu.Unlock()
	if deleting && !deleted && w.a.ctx.Err() == nil {
		// The kubelet's status manager deletes a terminating pod once its
		// containers are gone and its resources unprepared.
		err := w.a.client.CoreV1().Pods(pod.Namespace).Delete(w.a.ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64), Preconditions: metav1.NewUIDPreconditions(string(pod.UID)),
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			logger.Error(err, "Deleting the terminated pod")
		}
	}
	logger.V(2).Info("Pod worker done", "phase", w.phase)
}

// prepare calls the DRA manager until the pod's claims are prepared,
// recording each failure as a Warning event on the pod (as the kubelet
// does) and backing off; false when the pod went away first.
func (w *podWorker) prepare() bool {
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 30 * time.Second}
	for {
		pod := w.a.currentPod(w.pod.Namespace, w.pod.Name, w.pod.UID)
		if pod == nil || w.ctx.Err() != nil {
			return false
		}
		err := w.a.dra.PrepareResources(w.ctx, pod)
		if err == nil {
			w.mu.Lock()
			w.prepared = true
			w.mu.Unlock()
			return true
		}
		if w.ctx.Err() != nil {
			return false
		}
		w.logger().Info("Preparing dynamic resources failed, will retry", "err", err)
		w.event(corev1.EventTypeWarning, kubeletevents.FailedPrepareDynamicResources, "Failed to prepare dynamic resources: %v", err)
		select {
		case <-w.ctx.Done():
			return false
		case <-time.After(backoff.Step()):
		}
	}
}

// unprepare calls the DRA manager until the claims are unprepared (or
// the agent stops).
func (w *podWorker) unprepare() {
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 30 * time.Second}
	for w.a.ctx.Err() == nil {
		err := w.a.dra.UnprepareResources(w.a.ctx, w.pod)
		if err == nil {
			return
		}
		w.logger().Error(err, "Unpreparing dynamic resources failed, will retry")
		select {
		case <-w.a.ctx.Done():
		case <-time.After(backoff.Step()):
		}
	}
}

// fail ends a pod that never ran.
func (w *podWorker) fail(reason, message string) {
	w.event(corev1.EventTypeWarning, reason, "%s", message)
	w.mu.Lock()
	w.phase, w.reason, w.message = corev1.PodFailed, reason, message
	w.mu.Unlock()
	w.pushStatus()
}

func (w *podWorker) runContainers() {
	w.mu.Lock()
	now := metav1.Now()
	w.started = &now
	w.mu.Unlock()
	w.pushStatus()

	for i := range w.pod.Spec.InitContainers {
		if exit := w.runContainer(&w.pod.Spec.InitContainers[i], &w.initStat[i]); exit != 0 {
			// restartPolicy Never: a failed init container fails the pod,
			// the app containers never start.
			w.mu.Lock()
			for j := range w.contStat {
				w.contStat[j].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}
			}
			w.phase = corev1.PodFailed
			w.mu.Unlock()
			w.pushStatus()
			return
		}
	}
	w.mu.Lock()
	w.initDone = true
	w.mu.Unlock()

	var wg sync.WaitGroup
	for i := range w.pod.Spec.Containers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.runContainer(&w.pod.Spec.Containers[i], &w.contStat[i])
		}()
	}
	wg.Wait()
	w.mu.Lock()
	w.phase = corev1.PodSucceeded
	for _, s := range w.contStat {
		if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			w.phase = corev1.PodFailed
		}
	}
	w.mu.Unlock()
	w.pushStatus()
}

// runContainer runs c once and returns its exit code; its status, kept
// in *st (guarded by w.mu), goes to the API server as it changes.
func (w *podWorker) runContainer(c *corev1.Container, st *corev1.ContainerStatus) int32 {
	logger := klog.LoggerWithValues(w.logger(), "container", c.Name)
	id := string(w.pod.UID) + "-" + c.Name
	terminate := func(exit int32, reason, message string, startedAt metav1.Time) int32 {
		w.mu.Lock()
		st.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: exit, Reason: reason, Message: message, StartedAt: startedAt, FinishedAt: metav1.Now(), ContainerID: "runc://" + id,
		}}
		st.Ready, st.Started = false, new(bool)
		w.mu.Unlock()
		w.pushStatus()
		return exit
	}

	if err := w.ctx.Err(); err != nil {
		return terminate(137, "Error", "not started: "+context.Cause(w.ctx).Error(), metav1.Time{})
	}
	spec, origin, err := w.containerSpec(c)
	if err != nil {
		logger.Error(err, "Creating the container")
		w.event(corev1.EventTypeWarning, kubeletevents.FailedToCreateContainer, "Error: %v", err)
		return terminate(128, "StartError", err.Error(), metav1.Time{})
	}
	if w.a.cfg.NoRuntime {
		// The spec is complete here: runc would be handed it next.
		startedAt := metav1.Now()
		w.a.keepLogs(w.pod, c.Name, []byte(describeSpec(spec, origin)))
		w.event(corev1.EventTypeNormal, kubeletevents.StartedContainer, "Built the OCI spec of container %s (NoRuntime: not run)", c.Name)
		return terminate(0, "Completed", "", startedAt)
	}
	bundle := filepath.Join(w.a.cfg.BundleDir, id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		w.event(corev1.EventTypeWarning, kubeletevents.FailedToCreateContainer, "Error: %v", err)
		return terminate(128, "StartError", err.Error(), metav1.Time{})
	}
	defer os.RemoveAll(bundle)

	startedAt := metav1.Now()
	w.mu.Lock()
	st.ContainerID = "runc://" + id
	st.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: startedAt}}
	st.Ready, st.Started = true, ptrTo(true)
	w.mu.Unlock()
	w.event(corev1.EventTypeNormal, kubeletevents.StartedContainer, "Started container %s", c.Name)
	w.pushStatus()

	exit, out, err := RunContainer(w.ctx, w.a.cfg.RuncRoot, bundle, id, spec)
	w.a.keepLogs(w.pod, c.Name, out)
	switch {
	case w.ctx.Err() != nil:
		w.event(corev1.EventTypeNormal, kubeletevents.KillingContainer, "Stopping container %s", c.Name)
		if exit <= 0 {
			exit = 137
		}
		return terminate(int32(exit), "Error", "killed: "+context.Cause(w.ctx).Error(), startedAt)
	case err != nil:
		logger.Error(err, "Running the container")
		w.event(corev1.EventTypeWarning, kubeletevents.FailedToStartContainer, "Error: %v", err)
		if exit <= 0 {
			exit = 128
		}
		return terminate(int32(exit), "StartError", err.Error(), startedAt)
	case exit == 0:
		return terminate(0, "Completed", "", startedAt)
	default:
		return terminate(int32(exit), "Error", "", startedAt)
	}
}

// specOrigin is what describeSpec needs to tell the pod's and the
// devices' parts of a spec from the defaults.
type specOrigin struct {
	defaultMounts []specs.Mount // ContainerSpec's own
	podEnv        []string      // the env before device plugins and CDI
	cdiDevices    []string      // injected, as named
}

// containerSpec is c's OCI spec with its CDI devices injected by the CDI
// library's cache, refreshed first (as containerd does per container).
func (w *podWorker) containerSpec(c *corev1.Container) (*specs.Spec, specOrigin, error) {
	var origin specOrigin
	args := append(append([]string{}, c.Command...), c.Args...)
	if len(args) == 0 {
		return nil, origin, fmt.Errorf("container %s has no command: the node agent has no images, set command", c.Name)
	}
	env, err := w.env(c)
	if err != nil {
		return nil, origin, err
	}
	var addCaps, dropCaps []string
	if sc := c.SecurityContext; sc != nil && sc.Capabilities != nil {
		for _, cap := range sc.Capabilities.Add {
			addCaps = append(addCaps, capName(cap))
		}
		for _, cap := range sc.Capabilities.Drop {
			dropCaps = append(dropCaps, capName(cap))
		}
	}
	// A capability this host cannot grant (this sandbox's bounding set
	// lacks CAP_SYS_RESOURCE, which the seed's Job adds) would make runc
	// fail; a real node grants it, so the stand-in drops it and says so.
	if missing := UnavailableCaps(addCaps...); len(missing) > 0 && !w.a.cfg.NoRuntime {
		w.event(corev1.EventTypeWarning, "CapabilityUnavailable", "container %s: %s not in this host's capability bounding set; running without", c.Name, strings.Join(missing, ", "))
		addCaps = removeAll(addCaps, missing)
	}
	spec := ContainerSpec(w.a.cfg.Rootfs, args, env, addCaps, w.pod.Spec.HostNetwork)
	if spec == nil || spec.Process == nil {
		return nil, origin, fmt.Errorf("container %s: no OCI spec", c.Name)
	}
	origin.defaultMounts = slices.Clone(spec.Mounts)
	if len(dropCaps) > 0 && spec.Process.Capabilities != nil {
		caps := spec.Process.Capabilities
		for _, set := range []*[]string{&caps.Bounding, &caps.Effective, &caps.Permitted, &caps.Inheritable, &caps.Ambient} {
			*set = removeAll(*set, dropCaps)
		}
	}
	if c.WorkingDir != "" {
		spec.Process.Cwd = c.WorkingDir
	}
	mounts, err := w.mounts(c)
	if err != nil {
		return nil, origin, err
	}
	// A pod's mount replaces the default one at the same place (/dev/shm
	// by a memory emptyDir), as containerd does.
	for _, m := range mounts {
		spec.Mounts = slices.DeleteFunc(spec.Mounts, func(d specs.Mount) bool {
			return filepath.Clean(d.Destination) == filepath.Clean(m.Destination)
		})
	}
	spec.Mounts = append(spec.Mounts, mounts...)

	origin.podEnv = slices.Clone(spec.Process.Env)
	info, err := w.a.dra.GetResources(w.pod, c)
	if err != nil {
		return nil, origin, fmt.Errorf("container %s: CDI devices of its claims: %w", c.Name, err)
	}
	var ids []string
	for _, d := range info.CDIDevices {
		ids = append(ids, d.Name)
	}
	devIDs, err := w.a.devices.allocate(w.ctx, w.pod, c, spec)
	if err != nil {
		return nil, origin, fmt.Errorf("container %s: %w", c.Name, err)
	}
	ids = append(ids, devIDs...)
	origin.cdiDevices = ids
	if len(ids) > 0 {
		if err := w.a.cdi.Refresh(); err != nil {
			// A broken spec of another claim must not stop this container;
			// if one of ours is broken InjectDevices says so below.
			w.logger().Info("Some CDI specs did not load", "dir", w.a.cfg.CDIDir, "err", err)
		}
		if unresolved, err := w.a.cdi.InjectDevices(spec, ids...); err != nil {
			return nil, origin, fmt.Errorf("container %s: injecting CDI devices %v from %s (unresolved: %v): %w", c.Name, ids, w.a.cfg.CDIDir, unresolved, err)
		}
	}
	return spec, origin, nil
}

func capName(c corev1.Capability) string {
	s := strings.ToUpper(string(c))
	if !strings.HasPrefix(s, "CAP_") {
		s = "CAP_" + s
	}
	return s
}

func removeAll(list, drop []string) []string {
	var out []string
	for _, s := range list {
		keep := true
		for _, d := range drop {
			if s == d || d == "CAP_ALL" {
				keep = false
			}
		}
		if keep {
			out = append(out, s)
		}
	}
	return out
}

// env is c's environment from the pod spec: values, and the downward-API
// fields a node knows. Other sources (ConfigMaps, Secrets, resources) are
// refused by name.
func (w *podWorker) env(c *corev1.Container) ([]string, error) {
	var env []string
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
			continue
		}
		f := e.ValueFrom.FieldRef
		if f == nil {
			return nil, fmt.Errorf("container %s: env %s: only value and fieldRef are supported by the node agent", c.Name, e.Name)
		}
		var v string
		switch f.FieldPath {
		case "metadata.name":
			v = w.pod.Name
		case "metadata.namespace":
			v = w.pod.Namespace
		case "metadata.uid":
			v = string(w.pod.UID)
		case "spec.nodeName":
			v = w.pod.Spec.NodeName
		case "spec.serviceAccountName":
			v = w.pod.Spec.ServiceAccountName
		case "status.hostIP", "status.podIP":
			v = "127.0.0.1"
		default:
			return nil, fmt.Errorf("container %s: env %s: fieldRef %s is not supported by the node agent", c.Name, e.Name, f.FieldPath)
		}
		env = append(env, e.Name+"="+v)
	}
	return env, nil
}

// mounts are c's volume mounts: emptyDir (a directory per pod, or a tmpfs
// for medium Memory) and hostPath.
func (w *podWorker) mounts(c *corev1.Container) ([]specs.Mount, error) {
	var out []specs.Mount
	for _, vm := range c.VolumeMounts {
		var vol *corev1.Volume
		for i := range w.pod.Spec.Volumes {
			if w.pod.Spec.Volumes[i].Name == vm.Name {
				vol = &w.pod.Spec.Volumes[i]
			}
		}
		if vol == nil {
			return nil, fmt.Errorf("container %s: volumeMount %s: no such volume", c.Name, vm.Name)
		}
		opts := []string{"rbind", "rw"}
		if vm.ReadOnly {
			opts = []string{"rbind", "ro"}
		}
		switch {
		case vol.EmptyDir != nil && vol.EmptyDir.Medium == corev1.StorageMediumMemory:
			// Containers of a pod do not share a tmpfs here (no pause
			// container holds one); each gets its own.
			o := []string{"nosuid", "nodev", "mode=1777"}
			if vol.EmptyDir.SizeLimit != nil {
				o = append(o, "size="+strconv.FormatInt(vol.EmptyDir.SizeLimit.Value(), 10))
			}
			if vm.ReadOnly {
				o = append(o, "ro")
			}
			out = append(out, specs.Mount{Destination: vm.MountPath, Type: "tmpfs", Source: "tmpfs", Options: o})
		case vol.EmptyDir != nil:
			dir := filepath.Join(w.a.cfg.BundleDir, "pods", string(w.pod.UID), "volumes", vol.Name)
			if err := os.MkdirAll(dir, 0o777); err != nil {
				return nil, err
			}
			out = append(out, specs.Mount{Destination: vm.MountPath, Type: "bind", Source: filepath.Join(dir, vm.SubPath), Options: opts})
		case vol.HostPath != nil:
			out = append(out, specs.Mount{Destination: vm.MountPath, Type: "bind", Source: filepath.Join(vol.HostPath.Path, vm.SubPath), Options: opts})
		default:
			return nil, fmt.Errorf("container %s: volume %s: only emptyDir and hostPath volumes are supported by the node agent", c.Name, vol.Name)
		}
	}
	return out, nil
}

// pushStatus writes the worker's view into the pod's status.
func (w *podWorker) pushStatus() {
	ctx := w.a.ctx
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		pod, err := w.a.client.CoreV1().Pods(w.pod.Namespace).Get(ctx, w.pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.UID != w.pod.UID || podIsTerminal(pod) {
			return nil
		}
		w.mu.Lock()
		w.fillStatus(&pod.Status)
		w.mu.Unlock()
		// The health the drivers reported for the pod's devices, as the
		// kubelet's status manager adds it (kubelet_pods.go).
		w.a.dra.UpdateAllocatedResourcesStatus(w.logger(), pod, &pod.Status)
		_, err = w.a.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		w.logger().Error(err, "Updating the pod status")
	}
}

// fillStatus sets the fields of status that a kubelet owns. w.mu is held.
func (w *podWorker) fillStatus(status *corev1.PodStatus) {
	phase := w.phase
	if phase == corev1.PodPending && w.initDone {
		for _, s := range w.contStat {
			if s.State.Waiting == nil {
				phase = corev1.PodRunning
			}
		}
	}
	status.Phase, status.Reason, status.Message = phase, w.reason, w.message
	status.HostIP = "127.0.0.1"
	status.HostIPs = []corev1.HostIP{{IP: "127.0.0.1"}}
	if w.pod.Spec.HostNetwork {
		status.PodIP = "127.0.0.1"
		status.PodIPs = []corev1.PodIP{{IP: "127.0.0.1"}}
	}
	if w.started != nil {
		status.StartTime = w.started
	}
	status.InitContainerStatuses = append([]corev1.ContainerStatus(nil), w.initStat...)
	status.ContainerStatuses = append([]corev1.ContainerStatus(nil), w.contStat...)
	if len(status.InitContainerStatuses) == 0 {
		status.InitContainerStatuses = nil
	}

	now := metav1.Now()
	boolCond := func(b bool) corev1.ConditionStatus {
		if b {
			return corev1.ConditionTrue
		}
		return corev1.ConditionFalse
	}
	allRunning := len(w.contStat) > 0
	for _, s := range w.contStat {
		if s.State.Running == nil {
			allRunning = false
		}
	}
	ready, readyReason := allRunning, ""
	if phase == corev1.PodSucceeded || phase == corev1.PodFailed {
		ready, readyReason = false, "PodCompleted"
	} else if !ready {
		readyReason = "ContainersNotReady"
	}
	setPodCondition(status, corev1.PodReadyToStartContainers, boolCond(w.prepared && w.started != nil), "", now)
	setPodCondition(status, corev1.PodInitialized, boolCond(w.initDone || phase == corev1.PodSucceeded), "", now)
	setPodCondition(status, corev1.ContainersReady, boolCond(ready), readyReason, now)
	setPodCondition(status, corev1.PodReady, boolCond(ready), readyReason, now)
}

func setPodCondition(status *corev1.PodStatus, typ corev1.PodConditionType, value corev1.ConditionStatus, reason string, now metav1.Time) {
	for i := range status.Conditions {
		c := &status.Conditions[i]
		if c.Type == typ {
			if c.Status != value {
				c.LastTransitionTime = now
			}
			c.Status, c.Reason = value, reason
			return
		}
	}
	status.Conditions = append(status.Conditions, corev1.PodCondition{Type: typ, Status: value, Reason: reason, LastTransitionTime: now})
	sort.SliceStable(status.Conditions, func(i, j int) bool { return status.Conditions[i].Type < status.Conditions[j].Type })
}

func ptrTo[T any](v T) *T { return &v }

// --- device plugins ----------------------------------------------------

// devicePlugins is the device-manager part of the agent. The kubelet's
// devicemanager.ManagerImpl cannot be used: its only constructor,
// NewManagerImpl, hard-codes /var/lib/kubelet/device-plugins/kubelet.sock
// (newManagerImpl, which takes the path, is unexported) and creates that
// directory on the host for its checkpoint at once. So the agent runs the
// kubelet's registration server and plugin clients
// (pkg/kubelet/cm/devicemanager/plugin/v1beta1: Register, the gRPC
// connection, the ListAndWatch stream) on <KubeletDir>/device-plugins and
// keeps ManagerImpl's bookkeeping itself, following it: capacity counts
// all devices, allocatable the healthy ones; when the last plugin of a
// resource disconnects its devices turn unhealthy (allocatable 0). Unlike
// the kubelet, resources are never dropped after the 5-minute grace, there
// is no checkpoint, and devices are allocated when a container starts (not
// at pod admission), without topology.
type devicePlugins struct {
	logger   klog.Logger
	server   dpplugin.Server
	onChange func()

	mu        sync.Mutex
	endpoints map[string]*dpEndpoint            // resource -> the newest connected plugin
	healthy   map[string]sets.Set[string]       // resource -> device IDs
	unhealthy map[string]sets.Set[string]       // resource -> device IDs
	allocated map[types.UID]map[string][]string // pod -> resource -> device IDs
}

type dpEndpoint struct {
	plugin  dpplugin.DevicePlugin
	options *dpapi.DevicePluginOptions
}

func newDevicePlugins(logger klog.Logger, dir string, onChange func()) (*devicePlugins, error) {
	d := &devicePlugins{
		logger:    klog.LoggerWithName(logger, "device-plugins"),
		onChange:  onChange,
		endpoints: map[string]*dpEndpoint{},
		healthy:   map[string]sets.Set[string]{},
		unhealthy: map[string]sets.Set[string]{},
		allocated: map[types.UID]map[string][]string{},
	}
	server, err := dpplugin.NewServer(d.logger, filepath.Join(dir, "kubelet.sock"), d, d)
	if err != nil {
		return nil, fmt.Errorf("device-plugin server: %w", err)
	}
	if err := server.Start(d.logger); err != nil {
		return nil, fmt.Errorf("device-plugin server at %s: %w", server.SocketPath(), err)
	}
	d.server = server
	return d, nil
}

func (d *devicePlugins) stop() {
	if d.server != nil {
		_ = d.server.Stop(d.logger)
	}
}

// CleanupPluginDirectory implements dpplugin.RegistrationHandler as
// ManagerImpl does: at start, every stale socket in the directory goes
// (plugins notice a new kubelet.sock and register again).
func (d *devicePlugins) CleanupPluginDirectory(logger klog.Logger, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() || e.Type()&os.ModeSocket == 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PluginConnected implements dpplugin.ClientHandler.
func (d *devicePlugins) PluginConnected(ctx context.Context, resourceName string, p dpplugin.DevicePlugin) error {
	options, err := p.API().GetDevicePluginOptions(ctx, &dpapi.Empty{})
	if err != nil {
		return fmt.Errorf("failed to get device plugin options: %v", err)
	}
	d.mu.Lock()
	d.endpoints[resourceName] = &dpEndpoint{plugin: p, options: options}
	d.mu.Unlock()
	d.logger.V(2).Info("Device plugin connected", "resourceName", resourceName, "socket", p.SocketPath())
	return nil
}

// PluginDisconnected implements dpplugin.ClientHandler.
func (d *devicePlugins) PluginDisconnected(logger klog.Logger, resourceName string, socketPath string) {
	d.mu.Lock()
	ep := d.endpoints[resourceName]
	if ep != nil && ep.plugin.SocketPath() == socketPath {
		delete(d.endpoints, resourceName)
		if d.unhealthy[resourceName] == nil {
			d.unhealthy[resourceName] = sets.New[string]()
		}
		d.unhealthy[resourceName] = d.unhealthy[resourceName].Union(d.healthy[resourceName])
		d.healthy[resourceName] = sets.New[string]()
	}
	d.mu.Unlock()
	logger.V(2).Info("Device plugin disconnected", "resourceName", resourceName, "socket", socketPath)
	d.onChange()
}

// PluginListAndWatchReceiver implements dpplugin.ClientHandler.
func (d *devicePlugins) PluginListAndWatchReceiver(logger klog.Logger, resourceName string, resp *dpapi.ListAndWatchResponse) {
	healthy, unhealthy := sets.New[string](), sets.New[string]()
	for _, dev := range resp.Devices {
		if dev.Health == dpapi.Healthy {
			healthy.Insert(dev.ID)
		} else {
			unhealthy.Insert(dev.ID)
		}
	}
	d.mu.Lock()
	d.healthy[resourceName], d.unhealthy[resourceName] = healthy, unhealthy
	d.mu.Unlock()
	logger.V(2).Info("Processed device updates for resource", "resourceName", resourceName, "totalCount", len(resp.Devices), "healthyCount", healthy.Len())
	d.onChange()
}

// capacity is what ManagerImpl.GetCapacity reports (but for resources
// to drop: there are none, see devicePlugins).
func (d *devicePlugins) capacity() (corev1.ResourceList, corev1.ResourceList) {
	d.mu.Lock()
	defer d.mu.Unlock()
	capacity, allocatable := corev1.ResourceList{}, corev1.ResourceList{}
	for name, h := range d.healthy {
		n := int64(h.Len() + d.unhealthy[name].Len())
		capacity[corev1.ResourceName(name)] = *resource.NewQuantity(n, resource.DecimalSI)
		allocatable[corev1.ResourceName(name)] = *resource.NewQuantity(int64(h.Len()), resource.DecimalSI)
	}
	return capacity, allocatable
}

// allocate asks the plugins for the devices of c's extended-resource
// limits, applies what they answer (env, mounts, device nodes,
// annotations) to spec and returns the CDI devices they name.
func (d *devicePlugins) allocate(ctx context.Context, pod *corev1.Pod, c *corev1.Container, spec *specs.Spec) ([]string, error) {
	if d == nil {
		return nil, nil
	}
	var cdiDevices []string
	names := make([]string, 0, len(c.Resources.Limits))
	for name := range c.Resources.Limits {
		names = append(names, string(name))
	}
	sort.Strings(names)
	for _, name := range names {
		q := c.Resources.Limits[corev1.ResourceName(name)]
		want := q.Value()
		d.mu.Lock()
		ep := d.endpoints[name]
		if ep == nil || want == 0 {
			_, known := d.healthy[name]
			d.mu.Unlock()
			if known && want > 0 {
				return nil, fmt.Errorf("the device plugin for %s is not connected", name)
			}
			continue
		}
		inUse := sets.New[string]()
		for _, byRes := range d.allocated {
			inUse.Insert(byRes[name]...)
		}
		free := sets.List(d.healthy[name].Difference(inUse))
		if int64(len(free)) < want {
			d.mu.Unlock()
			return nil, fmt.Errorf("%s: %d requested, %d free on the node", name, want, len(free))
		}
		ids := free[:want]
		if d.allocated[pod.UID] == nil {
			d.allocated[pod.UID] = map[string][]string{}
		}
		d.allocated[pod.UID][name] = append(d.allocated[pod.UID][name], ids...)
		d.mu.Unlock()

		api := ep.plugin.API()
		resp, err := api.Allocate(ctx, &dpapi.AllocateRequest{ContainerRequests: []*dpapi.ContainerAllocateRequest{{DevicesIds: ids}}})
		if err != nil {
			return nil, fmt.Errorf("device plugin Allocate for %s: %w", name, err)
		}
		if len(resp.ContainerResponses) == 0 {
			return nil, fmt.Errorf("device plugin Allocate for %s: no container response", name)
		}
		if ep.options != nil && ep.options.PreStartRequired {
			if _, err := api.PreStartContainer(ctx, &dpapi.PreStartContainerRequest{DevicesIds: ids}); err != nil {
				return nil, fmt.Errorf("device plugin PreStartContainer for %s: %w", name, err)
			}
		}
		r := resp.ContainerResponses[0]
		envNames := make([]string, 0, len(r.Envs))
		for k := range r.Envs {
			envNames = append(envNames, k)
		}
		sort.Strings(envNames)
		for _, k := range envNames {
			spec.Process.Env = append(spec.Process.Env, k+"="+r.Envs[k])
		}
		for _, m := range r.Mounts {
			opts := []string{"rbind", "rw"}
			if m.ReadOnly {
				opts = []string{"rbind", "ro"}
			}
			spec.Mounts = append(spec.Mounts, specs.Mount{Destination: m.ContainerPath, Type: "bind", Source: m.HostPath, Options: opts})
		}
		for _, dev := range r.Devices {
			if err := addDeviceNode(spec, dev); err != nil {
				return nil, fmt.Errorf("device plugin for %s: %w", name, err)
			}
		}
		for k, v := range r.Annotations {
			if spec.Annotations == nil {
				spec.Annotations = map[string]string{}
			}
			spec.Annotations[k] = v
		}
		for _, cd := range r.CdiDevices {
			cdiDevices = append(cdiDevices, cd.Name)
		}
	}
	return cdiDevices, nil
}

// release frees the devices of a pod that ended.
func (d *devicePlugins) release(uid types.UID) {
	if d == nil {
		return
	}
	d.mu.Lock()
	delete(d.allocated, uid)
	d.mu.Unlock()
}

// addDeviceNode adds a device plugin's DeviceSpec to spec, as a CRI
// runtime does: the node of the host path, allowed in the device cgroup.
func addDeviceNode(spec *specs.Spec, dev *dpapi.DeviceSpec) error {
	var st unix.Stat_t
	if err := unix.Stat(dev.HostPath, &st); err != nil {
		return fmt.Errorf("device %s: %w", dev.HostPath, err)
	}
	var typ string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		typ = "c"
	case unix.S_IFBLK:
		typ = "b"
	default:
		return fmt.Errorf("device %s is not a device node", dev.HostPath)
	}
	major, minor := int64(unix.Major(uint64(st.Rdev))), int64(unix.Minor(uint64(st.Rdev)))
	if spec.Linux == nil {
		spec.Linux = &specs.Linux{}
	}
	mode := os.FileMode(st.Mode & 0o777)
	spec.Linux.Devices = append(spec.Linux.Devices, specs.LinuxDevice{Path: dev.ContainerPath, Type: typ, Major: major, Minor: minor, FileMode: &mode})
	if spec.Linux.Resources == nil {
		spec.Linux.Resources = &specs.LinuxResources{}
	}
	access := dev.Permissions
	if access == "" {
		access = "rwm"
	}
	spec.Linux.Resources.Devices = append(spec.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: typ, Major: &major, Minor: &minor, Access: access})
	return nil
}

// describeSpec is NoRuntime's container output: the RDMA-relevant parts
// of spec, one line each, every list sorted:
//
//	cdi: the CDI devices injected (claims' and device plugins')
//	devices: the device nodes the container gets
//	env: the variables device plugins or CDI added or changed, and every
//	     RDMA_, NCCL_ and UCX_ one
//	capabilities: the effective set
//	mounts: the pod's and the devices' mounts ("/dev/shm tmpfs" for a
//	        memory emptyDir, "DEST bind SOURCE" otherwise), not the defaults
func describeSpec(spec *specs.Spec, origin specOrigin) string {
	var devices, env, caps, mounts []string
	if spec.Linux != nil {
		for _, d := range spec.Linux.Devices {
			devices = append(devices, d.Path)
		}
	}
	if spec.Process != nil {
		for _, kv := range spec.Process.Env {
			if !slices.Contains(origin.podEnv, kv) || strings.HasPrefix(kv, "RDMA_") || strings.HasPrefix(kv, "NCCL_") || strings.HasPrefix(kv, "UCX_") {
				env = append(env, kv)
			}
		}
		if spec.Process.Capabilities != nil {
			caps = append(caps, spec.Process.Capabilities.Effective...)
		}
	}
	for _, m := range spec.Mounts {
		if slices.ContainsFunc(origin.defaultMounts, func(d specs.Mount) bool { return reflect.DeepEqual(d, m) }) {
			continue
		}
		switch m.Type {
		case "bind":
			mounts = append(mounts, m.Destination+" bind "+m.Source)
		default:
			mounts = append(mounts, m.Destination+" "+m.Type)
		}
	}
	var b strings.Builder
	for _, l := range []struct {
		name, sep string
		vals      []string
	}{
		{"cdi", " ", slices.Clone(origin.cdiDevices)}, {"devices", " ", devices}, {"env", " ", env},
		{"capabilities", " ", caps}, {"mounts", ", ", mounts},
	} {
		slices.Sort(l.vals)
		l.vals = slices.Compact(l.vals)
		if len(l.vals) == 0 {
			l.vals = []string{"(none)"}
		}
		fmt.Fprintf(&b, "%s: %s\n", l.name, strings.Join(l.vals, l.sep))
	}
	return b.String()
}
