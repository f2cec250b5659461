// Command rdma-demo is `make demo`: a Kubernetes 1.37 control plane in this
// process (etcd, kube-apiserver, scheduler, controllers) and a simulated
// RDMA node (dgx-h100). Where the machine can (root, runc, iproute2), the
// node is real: the kubelet v1.37.2 and containerd 2.4.2 run the driver's
// DaemonSet from its Helm chart and the image `make image` builds, and the
// seed's Jobs in runc containers (realnode.go). Elsewhere the demo says why
// in one line and falls back to the node agent, a stand-in built from the
// kubelet's DRA manager beside the driver binary. It applies demo/specs and
// prints what a person wants to see.
//
// Without root or runc (or with --no-runtime) the node agent does not run
// the containers: it builds each one's OCI spec, CDI devices injected, and
// the demo shows what the container would get.
//
//	rdma-demo [--keep] [--preset dgx-h100] [--no-runtime]
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

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

const nodeName = "dgx01"

func main() {
	keep := flag.Bool("keep", false, "leave the cluster running for kubectl until Ctrl-C")
	preset := flag.String("preset", "dgx-h100", "simulated node: "+strings.Join(hcatest.PresetNames(), ", "))
	noRuntime := flag.Bool("no-runtime", false, "do not run containers, show their OCI specs (the default without root or runc)")
	flag.Parse()
	if err := run(*preset, *keep, *noRuntime); err != nil {
		// On stdout: `make demo` sends stderr (the cluster's logs) to DEMO_LOG.
		fmt.Println("rdma-demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n== "+format+"\n", args...) }

func run(preset string, keep, noRuntime bool) error {
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

	if !noRuntime {
		err := runRealNode(ctx, h, dir, preset, keep)
		var fb fallback
		if !errors.As(err, &fb) {
			return err
		}
		fmt.Printf("\nnote: no real node here (%s): the kubelet stand-in (node agent) runs the Jobs instead\n", fb.why)
	}

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

	step("simulating node %s (%s) and starting rdma-dra-driver on it (--sharing=shared --legacy=dra)", nodeName, preset)
	spec, err := hcatest.Preset(preset)
	if err != nil {
		return err
	}
	node, err := hcatest.Build(filepath.Join(dir, "node"), spec)
	if err != nil {
		return err
	}
	binary, err := cluster.BuildDriver(dir)
	if err != nil {
		return err
	}
	kubeletDir, cdiDir := filepath.Join(dir, "kubelet"), filepath.Join(dir, "cdi")
	drv, err := cluster.StartDriver(binary, "--node-name="+nodeName, "--kubeconfig="+cp.Kubeconfig,
		"--sysfs-root="+node.SysfsRoot, "--dev-root="+node.DevRoot, "--cdi-root="+cdiDir,
		"--kubelet-root-dir="+kubeletDir, "--sharing=shared", "--legacy=dra",
		"--metrics-address=127.0.0.1:0", "--healthz-address=127.0.0.1:0")
	if err != nil {
		return err
	}
	h.Cleanup(func() { _ = drv.Stop() })

	runnable, why := cluster.RuntimeAvailable()
	if noRuntime {
		runnable, why = false, "--no-runtime"
	}
	rootfs, runcRoot := "", ""
	if runnable {
		if rootfs, err = cluster.Rootfs(filepath.Join(dir, "rootfs")); err != nil {
			return err
		}
		runcRoot = filepath.Join(dir, "runc")
	} else {
		fmt.Printf("note: containers are not run (%s): the demo shows the OCI spec each would get\n", why)
	}
	agent, err := cluster.StartNodeAgent(ctx, cp, cluster.NodeAgentConfig{
		NodeName: nodeName, KubeletDir: kubeletDir, CDIDir: cdiDir, NoRuntime: !runnable,
		RuncRoot: runcRoot, BundleDir: filepath.Join(dir, "bundles"), Rootfs: rootfs,
		Allocatable: corev1.ResourceList{"cpu": resource.MustParse("8"), "memory": resource.MustParse("64Gi"), "pods": resource.MustParse("110")},
	})
	if err != nil {
		return err
	}
	h.Cleanup(agent.Stop)

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
		if err := showJob(ctx, cp, agent, allocs, job, runnable, why); err != nil {
			return err
		}
	}
	if keep {
		step("the cluster keeps running: export KUBECONFIG=%s  (Ctrl-C ends it; files in %s)", cp.Kubeconfig, dir)
		<-ctx.Done()
	}
	return nil
}

func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(2 * time.Minute)
	var last error
	for time.Now().Before(deadline) {
		if ok, err := cond(); ok {
			return nil
		} else if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("timed out waiting for %s (last error: %v)", what, last)
}

func attr(d resourceapi.Device, name string) string {
	a, ok := d.Attributes[resourceapi.QualifiedName(name)]
	switch {
	case !ok:
		return "-"
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return fmt.Sprint(*a.IntValue)
	case a.BoolValue != nil:
		return fmt.Sprint(*a.BoolValue)
	case a.VersionValue != nil:
		return *a.VersionValue
	}
	return "-"
}

func printSlices(ctx context.Context, cp *cluster.ControlPlane) {
	step("kubectl get resourceslices (the devices the driver published)")
	l, _ := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	tw := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tIBDEV\tMODEL\tLINK\tGBPS\tSTATE\tNUMA\tPCIE-ROOT\tSHARES")
	for _, s := range l.Items {
		for _, d := range s.Spec.Devices {
			shares := "-"
			if c, ok := d.Capacity["rdma.dra.dev/shares"]; ok {
				shares = c.Value.String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, attr(d, "rdma.dra.dev/ibdev"), attr(d, "rdma.dra.dev/model"),
				attr(d, "rdma.dra.dev/linkLayer"), attr(d, "rdma.dra.dev/rateGbps"), attr(d, "rdma.dra.dev/portState"),
				attr(d, "resource.kubernetes.io/numaNode"), attr(d, "resource.kubernetes.io/pcieRoot"), shares)
		}
	}
	tw.Flush()
}

// showJob prints how job name ended, what its claims got and its
// container's output: with no runtime, the description of the OCI spec
// the container would have run with (why says why it did not run).
func showJob(ctx context.Context, cp *cluster.ControlPlane, agent *cluster.NodeAgent, allocs *allocations, name string, runnable bool, why string) error {
	step("Job %s", name)
	pod, _, err := waitJob(ctx, cp, name)
	if err != nil {
		return err
	}
	fmt.Printf("pod %s: %s\n", pod.Name, pod.Status.Phase)
	for _, line := range allocs.of(pod.UID) {
		fmt.Println(line)
	}
	out := strings.TrimSpace(agent.Logs("default", pod.Name, "hps-benchmark"))
	if runnable {
		fmt.Println("container output (ls /dev/infiniband; RDMA/NCCL/UCX env; CapEff):")
	} else {
		fmt.Printf("container's OCI spec (not run: %s):\n", why)
	}
	for _, l := range strings.Split(out, "\n") {
		fmt.Println("  " + l)
	}
	return nil
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
