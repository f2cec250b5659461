// Command rdma-demo is `make demo`: a Kubernetes 1.37 control plane in this
// process (etcd, kube-apiserver, scheduler, controllers) and a simulated
// RDMA node (dgx-h100). Where the machine can (root), the node is real: the
// kubelet v1.37.2 and containerd 2.4.2 with runc (built into the node's
// cache when the host has none) run the driver's DaemonSet from its Helm
// chart and the image `make image` builds, then the Jobs of demo/specs in
// real containers (realnode.go). Elsewhere the demo says what is missing in
// one line and shows what needs no kubelet: the driver's ResourceSlices and
// the scheduler's allocations for the same Jobs.
//
//	rdma-demo [--keep] [--preset dgx-h100] [--no-node]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

const nodeName = "dgx01"

func main() {
	keep := flag.Bool("keep", false, "leave the cluster running for kubectl until Ctrl-C")
	preset := flag.String("preset", "dgx-h100", "simulated node: "+strings.Join(hcatest.PresetNames(), ", "))
	noNode := flag.Bool("no-node", false, "run no kubelet even where one could run: show slices and allocations only")
	flag.Parse()
	if err := run(*preset, *keep, *noNode); err != nil {
		// On stdout: `make demo` sends stderr (the cluster's logs) to DEMO_LOG.
		fmt.Println("rdma-demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n== "+format+"\n", args...) }

func run(preset string, keep, noNode bool) error {
	dir, err := os.MkdirTemp("", "rdma-demo-")
	if err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(dir, "cluster.log"))
	if err != nil {
		return err
	}
	h := cluster.NewHarness(logFile, dir)
	defer func() {
		h.Close()
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	why := "--no-node"
	if !noNode {
		err := runRealNode(ctx, h, dir, preset, keep)
		var fb fallback
		if !errors.As(err, &fb) {
			return err
		}
		why = fb.why
	}
	fmt.Printf("\nnote: no real node here (%s): the demo shows what needs no kubelet; `make test-vm` runs the real node inside a VM without root\n", why)
	return runWithoutKubelet(ctx, h, dir, preset, keep)
}

// runWithoutKubelet is the demo where no kubelet can run: the driver runs as
// a process beside a Node object, publishes its slices, and the scheduler
// allocates the Jobs' claims; no container starts.
func runWithoutKubelet(ctx context.Context, h *cluster.Harness, dir, preset string, keep bool) error {
	step("starting Kubernetes 1.37 in this process (etcd, kube-apiserver, scheduler, controllers)")
	cp, err := cluster.StartControlPlane(h, filepath.Join(dir, "cp"))
	if err != nil {
		return err
	}
	h.Cleanup(cp.Stop)
	if err := cluster.StartControllers(ctx, cp); err != nil {
		return err
	}
	if err := cluster.StartScheduler(ctx, cp); err != nil {
		return err
	}
	if err := registerNode(ctx, cp); err != nil {
		return err
	}

	step("simulating node %s (%s) and starting rdma-dra-driver on it (--sharing=shared --legacy=dra)", nodeName, preset)
	spec, err := hcatest.Preset(preset)
	if err != nil {
		return err
	}
	sim, err := hcatest.Build(filepath.Join(dir, "node"), spec)
	if err != nil {
		return err
	}
	binary, err := cluster.BuildDriver(dir)
	if err != nil {
		return err
	}
	drv, err := cluster.StartDriver(binary, "--node-name="+nodeName, "--kubeconfig="+cp.Kubeconfig,
		"--sysfs-root="+sim.SysfsRoot, "--dev-root="+sim.DevRoot, "--cdi-root="+filepath.Join(dir, "cdi"),
		"--kubelet-root-dir="+filepath.Join(dir, "kubelet"), "--sharing=shared", "--legacy=dra",
		"--metrics-address=127.0.0.1:0", "--healthz-address=127.0.0.1:0")
	if err != nil {
		return err
	}
	h.Cleanup(func() { _ = drv.Stop() })

	allocs, err := showSlicesAndWatch(ctx, cp)
	if err != nil {
		return err
	}
	root := cluster.RepoRoot()
	step("applying deployments/deviceclass*.yaml and demo/specs/{10-job-dra,20-job-legacy}.yaml")
	if _, err := cluster.ApplyFiles(ctx, cp.Config, false,
		filepath.Join(root, "deployments", "deviceclasses.yaml"), filepath.Join(root, "deployments", "deviceclass-legacy.yaml"),
		filepath.Join(root, "demo", "specs", "10-job-dra.yaml"), filepath.Join(root, "demo", "specs", "20-job-legacy.yaml")); err != nil {
		return err
	}
	for _, job := range []string{"hps-benchmark", "hps-benchmark-legacy"} {
		if err := showScheduledJob(ctx, cp, allocs, job); err != nil {
			return err
		}
	}
	if keep {
		step("the cluster keeps running: export KUBECONFIG=%s  (Ctrl-C ends it; files in %s)", cp.Kubeconfig, dir)
		<-ctx.Done()
	}
	return nil
}

// registerNode creates the Node object a kubelet would: Ready, with room for
// the Jobs, so the scheduler places their pods.
func registerNode(ctx context.Context, cp *cluster.ControlPlane) error {
	res := corev1.ResourceList{"cpu": resource.MustParse("8"), "memory": resource.MustParse("64Gi"), "pods": resource.MustParse("110")}
	n, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{corev1.LabelHostname: nodeName}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("registering node %s: %w", nodeName, err)
	}
	n.Status = corev1.NodeStatus{
		Capacity: res, Allocatable: res,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "DemoWithoutKubelet",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
	}
	if _, err := cp.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", nodeName, err)
	}
	return nil
}

// showScheduledJob waits until the scheduler has bound the Job's pod and
// prints what its claims were allocated: the part of a pod's start that needs
// no kubelet.
func showScheduledJob(ctx context.Context, cp *cluster.ControlPlane, allocs *allocations, name string) error {
	step("Job %s (scheduled; no kubelet runs it here)", name)
	var pod corev1.Pod
	if err := waitFor(ctx, "the pod of job "+name+" to be scheduled with its claims allocated", func() (bool, error) {
		pods, err := cp.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
		if err != nil || len(pods.Items) == 0 || pods.Items[0].Spec.NodeName == "" {
			return false, err
		}
		pod = pods.Items[0]
		return len(allocs.of(pod.UID)) > 0, nil
	}); err != nil {
		return err
	}
	fmt.Printf("pod %s: bound to %s\n", pod.Name, pod.Spec.NodeName)
	for _, line := range allocs.of(pod.UID) {
		fmt.Println(line)
	}
	return nil
}

// waitFor polls cond for up to 2 minutes; its errors are not final, the
// last is reported with a timeout.
func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	return poll.Until(ctx, what, 200*time.Millisecond, 2*time.Minute, func(context.Context) (bool, string, error) {
		ok, err := cond()
		if err != nil {
			return false, "error " + err.Error(), nil
		}
		return ok, "", nil
	})
}

// attr formats a device's attribute by name; a missing one is "-".
func attr(d resourceapi.Device, name string) string {
	a, ok := d.Attributes[resourceapi.QualifiedName(name)]
	if !ok {
		return "-"
	}
	return devices.AttributeString(a)
}

func printSlices(ctx context.Context, cp *cluster.ControlPlane) {
	step("kubectl get resourceslices (the devices the driver published)")
	l, _ := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	tw := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tMODEL\tLINK\tGBPS\tNETDEV\tNUMA\tPCIE-ROOT\tSHARES")
	for _, s := range l.Items {
		for _, d := range s.Spec.Devices {
			shares := "-"
			if c, ok := d.Capacity["rdma.dra.dev/shares"]; ok {
				shares = c.Value.String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, attr(d, "rdma.dra.dev/model"),
				attr(d, "rdma.dra.dev/linkLayer"), attr(d, "rdma.dra.dev/rateGbps"), attr(d, "rdma.dra.dev/netdev"),
				attr(d, "resource.kubernetes.io/numaNode"), attr(d, "resource.kubernetes.io/pcieRoot"), shares)
		}
	}
	tw.Flush()
}

// waitJob waits for a Job to complete or fail and returns its pod and how
// long it ran (from its status's second-granular times; 0 when unknown).
func waitJob(ctx context.Context, cp *cluster.ControlPlane, name string) (corev1.Pod, time.Duration, error) {
	var pod corev1.Pod
	var took time.Duration
	err := waitFor(ctx, "job "+name+" to finish", func() (bool, error) {
		j, err := cp.Client.BatchV1().Jobs("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range j.Status.Conditions {
			if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
				pods, err := cp.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
				if err != nil || len(pods.Items) == 0 {
					return false, err
				}
				pod = pods.Items[0]
				if st, done := j.Status.StartTime, j.Status.CompletionTime; st != nil && done != nil {
					took = done.Sub(st.Time)
				}
				return true, nil
			}
		}
		return false, nil
	})
	return pod, took, err
}

// showSlicesAndWatch waits for the driver's ResourceSlice, prints it and
// starts recording what claims are allocated.
func showSlicesAndWatch(ctx context.Context, cp *cluster.ControlPlane) (*allocations, error) {
	if err := waitFor(ctx, "the node's ResourceSlice", func() (bool, error) {
		l, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) > 0, err
	}); err != nil {
		return nil, err
	}
	printSlices(ctx, cp)
	return watchAllocations(ctx, cp)
}

// allocations remembers what the claims reserved for each pod were given:
// the claims of a template are deleted as soon as the pod ends, before the
// demo prints.
type allocations struct {
	mu    sync.Mutex
	byPod map[types.UID][]string
}

func watchAllocations(ctx context.Context, cp *cluster.ControlPlane) (*allocations, error) {
	w, err := cp.Client.ResourceV1().ResourceClaims("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	a := &allocations{byPod: map[types.UID][]string{}}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			c, ok := ev.Object.(*resourceapi.ResourceClaim)
			if !ok || c.Status.Allocation == nil {
				continue
			}
			for _, r := range c.Status.Allocation.Devices.Results {
				share := ""
				if r.ShareID != nil {
					share = " share " + string(*r.ShareID)
				}
				line := fmt.Sprintf("claim %s: request %q got %s/%s/%s%s", c.Name, r.Request, r.Driver, r.Pool, r.Device, share)
				a.mu.Lock()
				for _, ref := range c.Status.ReservedFor {
					if !slices.Contains(a.byPod[ref.UID], line) {
						a.byPod[ref.UID] = append(a.byPod[ref.UID], line)
					}
				}
				a.mu.Unlock()
			}
		}
	}()
	return a, nil
}

func (a *allocations) of(pod types.UID) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.byPod[pod])
}
