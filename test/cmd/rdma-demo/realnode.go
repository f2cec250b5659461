package main

// The demo on a real node: kubelet v1.37.2 and containerd 2.4.2 with runc
// (test/node) beside the in-process control plane, the driver installed by
// its Helm chart from the image `make image` builds. The container runtime,
// not our code, applies the CDI specs.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/node"
)

// fallback is an error that means "this machine cannot run the real node":
// the demo says why and shows what needs no kubelet.
type fallback struct{ why string }

func (f fallback) Error() string { return f.why }

func runRealNode(ctx context.Context, h *cluster.Harness, dir, preset string, keep bool) error {
	if err := node.Check(); err != nil {
		return fallback{err.Error()}
	}
	step("the node's binaries: kubelet v1.37.2, containerd 2.4.2, CNI plugins (built once, then cached; the first build takes 10-15 minutes on 2 cores)")
	if _, err := node.EnsureBinaries(func(f string, a ...any) { fmt.Printf("  "+f+"\n", a...) }); err != nil {
		return fallback{fmt.Sprintf("the node's binaries cannot be built: %v", err)}
	}
	step("make image: the driver's image as an OCI tarball, without Docker")
	image, err := node.BuildDriverImage(dir)
	if err != nil {
		return err
	}
	fmt.Println("  " + image)

	step("starting Kubernetes 1.37 in this process (etcd, kube-apiserver, scheduler, controllers)")
	cp, err := node.StartControlPlane(ctx, h, filepath.Join(dir, "cp"))
	if err != nil {
		return err
	}

	step("a real node: containerd + runc + the kubelet in a private mount and network namespace, on a simulated %s", preset)
	spec, err := hcatest.Preset(preset)
	if err != nil {
		return err
	}
	sim, err := hcatest.Build(filepath.Join(dir, "hca"), spec)
	if err != nil {
		return err
	}
	n, err := node.Start(ctx, h, cp, node.Options{Images: []string{image}})
	if err != nil {
		return err
	}
	printNodes(ctx, cp)

	memlock, why, err := cluster.HostMemlock()
	if err != nil {
		return err
	}
	step("helm install rdma deployments/helm/rdma-dra-driver --set sharing=shared,legacy.route=dra,memlock=%s (the image just built; memlock: %s)", memlock, why)
	values := fmt.Sprintf(`{"image":{"tag":"dev"},"sysfsRoot":%q,"devRoot":%q,"sharing":"shared","legacy":{"route":"dra"},"memlock":%q}`, sim.SysfsRoot, sim.DevRoot, memlock)
	if _, err := cluster.InstallChart(ctx, cp, dir, "rdma", "rdma-system", values); err != nil {
		return err
	}
	if err := waitFor(ctx, "the driver pod to be Ready", func() (bool, error) {
		pods, err := cp.Client.CoreV1().Pods("rdma-system").List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) == 0 {
			return false, err
		}
		for _, c := range pods.Items[0].Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	printDriverPods(ctx, cp)
	allocs, err := showSlicesAndWatch(ctx, cp)
	if err != nil {
		return err
	}
	step("kubectl apply -f demo/specs/10-job-dra.yaml -f demo/specs/20-job-legacy.yaml")
	for _, f := range []string{"10-job-dra.yaml", "20-job-legacy.yaml"} {
		note, err := node.ApplySpec(ctx, cp, dir, filepath.Join("demo", "specs", f))
		if err != nil {
			return err
		}
		if note != "" {
			fmt.Println("  note: " + note)
		}
	}
	for _, job := range []string{"hps-benchmark", "hps-benchmark-legacy"} {
		if err := showRealJob(ctx, cp, allocs, job); err != nil {
			return err
		}
	}
	if keep {
		step("the cluster keeps running: export KUBECONFIG=%s  (Ctrl-C ends it; node files in %s)", cp.Kubeconfig, n.Dir)
		<-ctx.Done()
	}
	return nil
}

func printNodes(ctx context.Context, cp *cluster.ControlPlane) {
	step("kubectl get nodes -o wide")
	l, _ := cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	tw := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tVERSION\tINTERNAL-IP\tKERNEL-VERSION\tCONTAINER-RUNTIME")
	for _, n := range l.Items {
		status, ip := "NotReady", ""
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				status = "Ready"
			}
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ip = a.Address
			}
		}
		i := n.Status.NodeInfo
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, status, i.KubeletVersion, ip, i.KernelVersion, i.ContainerRuntimeVersion)
	}
	tw.Flush()
}

func printDriverPods(ctx context.Context, cp *cluster.ControlPlane) {
	step("kubectl -n rdma-system get pods -o wide")
	l, _ := cp.Client.CoreV1().Pods("rdma-system").List(ctx, metav1.ListOptions{})
	tw := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tREADY\tSTATUS\tRESTARTS\tNODE\tIMAGE")
	for _, p := range l.Items {
		ready, restarts := 0, int32(0)
		for _, c := range p.Status.ContainerStatuses {
			if c.Ready {
				ready++
			}
			restarts += c.RestartCount
		}
		fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%d\t%s\t%s\n", p.Name, ready, len(p.Spec.Containers), p.Status.Phase, restarts, p.Spec.NodeName, p.Spec.Containers[0].Image)
	}
	tw.Flush()
}

// showRealJob waits for a Job, prints its claims' allocations and its
// container's log as the kubelet serves it (kubectl logs).
func showRealJob(ctx context.Context, cp *cluster.ControlPlane, allocs *allocations, name string) error {
	step("Job %s", name)
	pod, took, err := waitJob(ctx, cp, name)
	if err != nil {
		return err
	}
	fmt.Printf("pod %s: %s (the Job ran %s, by its status's second-granular times)\n", pod.Name, pod.Status.Phase, took)
	for _, line := range allocs.of(pod.UID) {
		fmt.Println(line)
	}
	out, err := cp.Client.CoreV1().Pods("default").GetLogs(pod.Name, &corev1.PodLogOptions{Container: "hps-benchmark"}).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("kubectl logs %s: %w", pod.Name, err)
	}
	fmt.Printf("kubectl logs %s (ls /dev/infiniband; RDMA/NCCL/UCX env; CapEff):\n", pod.Name)
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fmt.Println("  " + l)
	}
	return nil
}
