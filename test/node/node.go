// Package node starts a real Kubernetes node beside the in-process control
// plane of test/cluster: containerd 2.4.2 with runc and the CNI bridge, and
// the kubelet v1.37.2, as subprocesses. They run in one private mount and
// network namespace: the paths the kubelet and containerd hard-code
// (/var/lib/kubelet, /var/lib/cni, /var/log, /run, /opt) are the test's
// work directory there, the kernel sysctls the kubelet sets are files, and
// the CNI bridge and pod networks live and die with the namespace. The
// host only sees the cgroups (under a per-node root, removed at Stop) and
// one TCP port on its address, forwarded to the kubelet for pods/log.
//
// Start is the slow path only once: binaries are built and cached (see
// EnsureBinaries); a warm Start takes seconds.
package node

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// Options for Start.
type Options struct {
	// Name of the Node object; default "rdma-node".
	Name string
	// Images are OCI image tarballs imported into containerd's k8s.io
	// namespace besides the pause and busybox images (e.g. the driver's,
	// from `make image`).
	Images []string
	// NoPivotRoot makes runc enter containers with chroot instead of
	// pivot_root, which fails where the node's root is an initramfs (a
	// node inside test/vm's guest).
	NoPivotRoot bool
	// MaxContainerRestartPeriod caps the kubelet's crash-loop back-off
	// (its crashLoopBackOff.maxContainerRestartPeriod); zero keeps the
	// default 10s doubling to 5 minutes.
	MaxContainerRestartPeriod time.Duration
	// SharedNetwork runs the node in the caller's network namespace
	// instead of a new one: a node that is a whole VM (test/vm's two-node
	// test), whose hostNetwork pods must reach the VM's own NICs and their
	// RDMA devices' addresses. The node's IP is then the VM's own address
	// and the kubelet's port is not forwarded.
	SharedNetwork bool
	// PodCIDR is the subnet the node's bridge CNI hands pod addresses out
	// of; default DefaultPodCIDR. Nodes whose pods talk to each other need
	// distinct ones, and routes between them (test/vm's two nodes).
	PodCIDR string
}

// DefaultPodCIDR is a node's pod subnet unless Options.PodCIDR says.
const DefaultPodCIDR = "10.88.0.0/16"

// Image names on the node. Pods refer to busybox as "busybox" (it is
// docker.io/library/busybox:latest there) and must not pull: use
// imagePullPolicy IfNotPresent or Never.
const (
	PauseImage   = "localhost/rdma-dra/pause:1"
	BusyboxImage = "docker.io/library/busybox:latest"
)

// Node is a running node.
type Node struct {
	Name string
	// Dir is the work directory: var-lib (the node's /var/lib), var-log,
	// run, opt, etc (configs), logs (component logs).
	Dir string
	// IP is the node's InternalIP (the host's address, also assigned
	// inside the node's network namespace) and KubeletPort its port.
	IP          string
	KubeletPort int
	Bin         *Binaries

	tb         cluster.TB
	cp         *cluster.ControlPlane
	holder     *exec.Cmd
	holderIn   io.WriteCloser
	nsPid      int
	netns      *netnsDialer
	cgroupRoot string
	listeners  []net.Listener

	mu      sync.Mutex
	procs   map[string]*process
	stopped bool
}

// Start builds or reuses the binaries, starts containerd and the kubelet
// against cp and waits until the Node is Ready. Everything is torn down by
// Stop, which tb's cleanup calls (also when the test fails). Callers should
// call Check first and skip with its reason.
func Start(ctx context.Context, tb cluster.TB, cp *cluster.ControlPlane, opts Options) (*Node, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	if opts.Name == "" {
		opts.Name = "rdma-node"
	}
	bin, err := EnsureBinaries(tb.Logf)
	if err != nil {
		return nil, err
	}
	ip, err := hostIP()
	if err != nil {
		return nil, err
	}
	n := &Node{
		Name:       opts.Name,
		Dir:        tb.TempDir(),
		IP:         ip,
		Bin:        bin,
		tb:         tb,
		cp:         cp,
		cgroupRoot: fmt.Sprintf("/%s%d-%d", cgroupPrefix, os.Getpid(), nodeSeq.Add(1)),
		procs:      map[string]*process{},
	}
	sweepStale(tb.Logf)
	tb.Cleanup(n.Stop)
	start := time.Now()
	if err := n.start(ctx, opts); err != nil {
		return nil, err
	}
	tb.Logf("node %s: Ready in %s (kubelet %s, containerd %s, work dir %s)", n.Name,
		time.Since(start).Round(10*time.Millisecond), KubeletVersion, ContainerdVersion, n.Dir)
	return n, nil
}

func (n *Node) start(ctx context.Context, opts Options) error {
	for _, d := range []string{"var-lib/kubelet", "var-lib/cni/net.d", "var-lib/containerd", "var-log", "run", "opt", "etc", "logs", "sysctl", "pki", "images"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := n.makeCgroupRoot(); err != nil {
		return err
	}
	if err := n.startNamespaces(opts.SharedNetwork); err != nil {
		return err
	}
	if err := n.startProxies(ctx, opts.SharedNetwork); err != nil {
		return err
	}
	if err := n.writeContainerdConfig(opts.NoPivotRoot, cmp.Or(opts.PodCIDR, DefaultPodCIDR)); err != nil {
		return err
	}
	if err := n.StartContainerd(ctx); err != nil {
		return err
	}
	images, err := n.baseImages()
	if err != nil {
		return err
	}
	for _, img := range append(images, opts.Images...) {
		if err := n.ImportImage(ctx, img); err != nil {
			return err
		}
	}
	if err := n.writeKubeletConfig(opts.MaxContainerRestartPeriod); err != nil {
		return err
	}
	return n.StartKubelet(ctx)
}

// Teardown.

// Stop ends everything the node started: the kubelet, containerd, every
// shim and container (all processes in the node's mount namespace or its
// cgroups), the namespaces (with them the mounts, the CNI bridge and the
// pod networks), the proxies and the cgroups. It is safe to call twice.
func (n *Node) Stop() {
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		return
	}
	n.stopped = true
	procs := n.procs
	n.mu.Unlock()
	start := time.Now()
	defer func() { n.tb.Logf("node %s: stopped in %s", n.Name, time.Since(start).Round(10*time.Millisecond)) }()
	// A component that died on its own during the test fails it.
	for _, name := range []string{"containerd", "kubelet"} {
		if p := procs[name]; p != nil && !p.stopped.Load() {
			if err := p.exited(); err != nil {
				n.tb.Errorf("node %s: %v", n.Name, err)
			}
		}
	}
	if n.tb.Failed() {
		for _, name := range []string{"containerd", "kubelet"} {
			if p := procs[name]; p != nil {
				b, _ := os.ReadFile(p.log)
				n.tb.Logf("node %s: last lines of %s:\n%s", n.Name, p.log, LastLines(string(b), 40))
			}
		}
	}
	if p := procs["kubelet"]; p != nil {
		p.stop(5 * time.Second)
	}
	if p := procs["containerd"]; p != nil {
		p.stop(5 * time.Second)
	}
	if err := n.killAll(); err != nil {
		n.tb.Errorf("node %s teardown: %v", n.Name, err)
	}
	for _, l := range n.listeners {
		_ = l.Close()
	}
	if n.netns != nil {
		n.netns.close()
	}
	if n.holder != nil {
		_ = n.holderIn.Close()
		done := make(chan struct{})
		go func() { _ = n.holder.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = n.holder.Process.Kill()
			<-done
		}
	}
	if err := n.removeCgroups(); err != nil {
		n.tb.Errorf("node %s teardown: %v", n.Name, err)
	}
}

// killAll SIGKILLs, until none is left, every process in the node's mount
// namespace (but the holder) or in a cgroup under its root: shims,
// containers (their own mount namespaces, but our cgroups), leftovers.
func (n *Node) killAll() error {
	if n.nsPid == 0 {
		return nil
	}
	mntNS, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", n.nsPid))
	if err != nil {
		return fmt.Errorf("the node's mount namespace: %w", err)
	}
	var pids map[int]bool
	err = poll.Until(context.Background(), "the node's processes to be gone", 50*time.Millisecond, 30*time.Second, func(context.Context) (bool, string, error) {
		pids = n.cgroupPids()
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == n.nsPid || pid == os.Getpid() {
				continue
			}
			if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && ns == mntNS {
				pids[pid] = true
			}
		}
		for pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return len(pids) == 0, "", nil
	})
	if err != nil {
		return fmt.Errorf("processes left after 30s of SIGKILL: %v", pids)
	}
	return nil
}

// cgroupPids are the processes in every cgroup under the node's root.
func ControlPlaneOptions() cluster.ControlPlaneOptions {
	return cluster.ControlPlaneOptions{
		ServiceAccounts: true,
		ExtraFlags:      []string{"--kubelet-preferred-address-types=InternalIP"},
	}
}
