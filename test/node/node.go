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
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
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
}

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
	if err := n.writeContainerdConfig(opts.NoPivotRoot); err != nil {
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

// ---- namespaces ----

// startNamespaces starts the holder: a shell in a new mount and network
// namespace that bind-mounts the work dir over the node's paths, brings up
// loopback with the node and service addresses, and waits for stdin to
// close. Components join its namespaces with nsenter.
func (n *Node) startNamespaces(sharedNetwork bool) error {
	svcIP, _, err := n.apiService()
	if err != nil {
		return err
	}
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, m := range [][2]string{{"var-lib", "/var/lib"}, {"var-log", "/var/log"}, {"run", "/run"}, {"opt", "/opt"}} {
		fmt.Fprintf(&script, "mount --bind %q %q\n", filepath.Join(n.Dir, m[0]), m[1])
	}
	// The kubelet sets these unless they already hold its values.
	for _, s := range []struct{ path, value string }{
		{"vm/overcommit_memory", "1"}, {"vm/panic_on_oom", "0"},
		{"kernel/panic", "10"}, {"kernel/panic_on_oops", "1"},
		{"kernel/keys/root_maxkeys", "1000000"}, {"kernel/keys/root_maxbytes", "25000000"},
	} {
		if _, err := os.Stat("/proc/sys/" + s.path); err != nil {
			continue
		}
		file := filepath.Join(n.Dir, "sysctl", strings.ReplaceAll(s.path, "/", "."))
		if err := os.WriteFile(file, []byte(s.value+"\n"), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(&script, "mount --bind %q %q\n", file, "/proc/sys/"+s.path)
	}
	unshare := []string{"--mount", "--net"}
	if sharedNetwork {
		// The node's IP is already an address of the namespace.
		unshare = unshare[:1]
		fmt.Fprintf(&script, "ip addr add %s/32 dev lo\n", svcIP)
	} else {
		fmt.Fprintf(&script, "ip link set lo up\nip addr add %s/32 dev lo\nip addr add %s/32 dev lo\n", n.IP, svcIP)
	}
	script.WriteString("echo ready\nexec cat >/dev/null\n")

	cmd := exec.Command("unshare", append(unshare, "--propagation", "private", "--", "/bin/sh", "-c", script.String())...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("node namespaces (unshare): %w", err)
	}
	n.holder, n.holderIn, n.nsPid = cmd, in, cmd.Process.Pid
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		_ = cmd.Wait()
		return fmt.Errorf("node namespaces (unshare + mounts): %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	n.netns, err = newNetnsDialer(fmt.Sprintf("/proc/%d/ns/net", n.nsPid))
	return err
}

// apiService is the kubernetes Service's cluster IP and port: pods reach
// the API server there (in-cluster config), as kube-proxy would route it.
func (n *Node) apiService() (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		svc, err := n.cp.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err == nil && svc.Spec.ClusterIP != "" && len(svc.Spec.Ports) > 0 {
			return svc.Spec.ClusterIP, int(svc.Spec.Ports[0].Port), nil
		}
		select {
		case <-ctx.Done():
			return "", 0, fmt.Errorf("the API server's default/kubernetes Service: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startProxies connects the node's network namespace with the host's: the
// API server (host loopback) is reachable inside at 127.0.0.1:6443 (the
// kubelet) and at the kubernetes Service's address (pods); the kubelet's
// port is reachable from the host at IP:KubeletPort (the API server's
// pods/log, exec and port-forward).
func (n *Node) startProxies(ctx context.Context, sharedNetwork bool) error {
	api := strings.TrimPrefix(strings.TrimPrefix(n.cp.Config.Host, "https://"), "http://")
	svcIP, svcPort, err := n.apiService()
	if err != nil {
		return err
	}
	dialAPI := func() (net.Conn, error) { return net.DialTimeout("tcp", api, 5*time.Second) }
	for _, addr := range []string{"127.0.0.1:6443", net.JoinHostPort(svcIP, strconv.Itoa(svcPort))} {
		l, err := n.netns.listen(addr)
		if err != nil {
			return fmt.Errorf("node network: listening on %s for the API server: %w", addr, err)
		}
		n.listeners = append(n.listeners, l)
		go forward(l, dialAPI)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(n.IP, "0"))
	if err != nil {
		return fmt.Errorf("node network: a port on %s for the kubelet: %w", n.IP, err)
	}
	n.KubeletPort = l.Addr().(*net.TCPAddr).Port
	if sharedNetwork {
		// The kubelet listens on this very address itself.
		return l.Close()
	}
	n.listeners = append(n.listeners, l)
	kubelet := l.Addr().String()
	go forward(l, func() (net.Conn, error) { return n.netns.dial(kubelet) })
	return nil
}

// hostIP is the host's first global IPv4 address: the kubelet refuses a
// loopback node IP, and the API server dials the node's InternalIP.
func hostIP() (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := iface.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
				return ipn.IP.String(), nil
			}
		}
	}
	return "", errors.New("the host has no global IPv4 address for the node's InternalIP")
}

// ---- cgroups ----

// cgroupMounts are the host's cgroup hierarchies (v1 controllers, the
// hybrid unified one, or the v2 root).
func cgroupMounts() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, " - ", 2)
		if len(parts) != 2 {
			continue
		}
		fields := strings.Fields(parts[0])
		fstype := strings.Fields(parts[1])
		if len(fields) < 5 || len(fstype) == 0 || (fstype[0] != "cgroup" && fstype[0] != "cgroup2") {
			continue
		}
		dirs = append(dirs, fields[4])
	}
	sort.Strings(dirs)
	return dirs, nil
}

// makeCgroupRoot creates the kubelet's cgroupRoot in every hierarchy (the
// kubelet requires it to exist); cpuset needs its cpus and mems set. On a
// cgroup v2 root nobody has delegated controllers on (a bare guest kernel,
// no systemd), it enables them first: the kubelet wants cpu, memory and
// pids under its root, and a claim's rdma.max needs rdma.
func (n *Node) makeCgroupRoot() error {
	dirs, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if err := enableControllers(d); err != nil {
			return fmt.Errorf("node cgroup root: %w", err)
		}
		dir := filepath.Join(d, n.cgroupRoot)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("node cgroup root: %w", err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("node cgroup root: %s: %w", filepath.Join(dir, f), err)
				}
			}
		}
	}
	return nil
}

// enableControllers writes every controller of a cgroup v2 root's
// cgroup.controllers into its cgroup.subtree_control (nothing to do on a
// v1 hierarchy, or where they are enabled already).
func enableControllers(root string) error {
	avail, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return nil // a v1 hierarchy
	}
	control := filepath.Join(root, "cgroup.subtree_control")
	on, err := os.ReadFile(control)
	if err != nil {
		return err
	}
	enabled := strings.Fields(string(on))
	for _, c := range strings.Fields(string(avail)) {
		if slices.Contains(enabled, c) {
			continue
		}
		if err := os.WriteFile(control, []byte("+"+c), 0o644); err != nil {
			return fmt.Errorf("enabling the %s controller in %s: %w", c, control, err)
		}
	}
	return nil
}

// ---- configs ----

func (n *Node) path(p ...string) string { return filepath.Join(append([]string{n.Dir}, p...)...) }

// ContainerdSocket is containerd's socket as the host sees it.
func (n *Node) ContainerdSocket() string { return n.path("run", "containerd", "containerd.sock") }

func (n *Node) writeContainerdConfig(noPivotRoot bool) error {
	cni := `{
  "cniVersion": "1.0.0",
  "name": "rdma-node",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true,
    "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]], "dataDir": "/var/lib/cni/networks"}
  }]
}
`
	if err := os.WriteFile(n.path("var-lib", "cni", "net.d", "10-rdma-node.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	// Paths are as the node's mount namespace sees them.
	cfg := fmt.Sprintf(`version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
# NRI would serve /run/nri: nothing here uses it.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q

[plugins."io.containerd.cri.v1.runtime"]
  # The sandbox's oom_score_adj -998 needs CAP_SYS_RESOURCE, which a
  # container-hosted test machine may lack: stay at containerd's own.
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
        NoPivotRoot = %t
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = "/var/lib/cni/net.d"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`, PauseImage, n.Bin.Runc, noPivotRoot, n.Bin.CNIDir)
	return os.WriteFile(n.path("etc", "containerd.toml"), []byte(cfg), 0o644)
}

func (n *Node) writeKubeletConfig(maxRestartPeriod time.Duration) error {
	// The kubelet's client: the API server through the namespace's proxy.
	ca, err := n.cp.ServingCA()
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["rdma-dra"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:6443", CertificateAuthorityData: ca}
	kc.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{Token: n.cp.Config.BearerToken}
	kc.Contexts["rdma-dra"] = &clientcmdapi.Context{Cluster: "rdma-dra", AuthInfo: "kubelet"}
	kc.CurrentContext = "rdma-dra"
	if err := clientcmd.WriteToFile(*kc, n.path("etc", "kubeconfig")); err != nil {
		return err
	}
	if err := os.WriteFile(n.path("etc", "resolv.conf"), []byte("nameserver 127.0.0.53\n"), 0o644); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: %s
# This machine has cgroups v1; the kubelet refuses them unless told.
failCgroupV1: false
failSwapOn: false
resolvConf: %s
# No eviction or image GC: the node runs on a test machine's disk, and
# the images are imported, not pulled.
evictionHard: {memory.available: "1Ki"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
fileCheckFrequency: 10s
shutdownGracePeriod: 0s
containerLogMaxSize: 10Mi
`, n.IP, n.KubeletPort, n.cgroupRoot, n.path("etc", "resolv.conf"))
	if maxRestartPeriod > 0 {
		cfg += fmt.Sprintf("crashLoopBackOff: {maxContainerRestartPeriod: %s}\n", maxRestartPeriod)
	}
	return os.WriteFile(n.path("etc", "kubelet.yaml"), []byte(cfg), 0o644)
}

// ---- components ----

// process is one component running in the node's namespaces.
type process struct {
	name    string
	cmd     *exec.Cmd
	log     string
	done    chan struct{}
	err     error
	stopped atomic.Bool // we ended it: not a crash
}

// spawn starts argv inside the node's namespaces (nsenter), its output to
// logs/<name>.log.
func (n *Node) spawn(name string, env []string, argv ...string) (*process, error) {
	logPath := n.path("logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	args := append([]string{"--target", strconv.Itoa(n.nsPid), "--mount", "--net", "--"}, argv...)
	cmd := exec.Command("nsenter", args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	n.mu.Lock()
	n.procs[name] = p
	n.mu.Unlock()
	return p, nil
}

// exited returns an error naming the component and its last log lines if
// it has ended.
func (p *process) exited() error {
	select {
	case <-p.done:
		b, _ := os.ReadFile(p.log)
		return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.name, p.err, p.log, LastLines(string(b), 25))
	default:
		return nil
	}
}

// stop sends SIGTERM, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	p.stopped.Store(true)
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// StartContainerd starts containerd and waits until it answers.
func (n *Node) StartContainerd(ctx context.Context) error {
	// The shims inherit containerd's environment: ownerEnv lets a later
	// run find them if this process dies without its cleanups.
	env := []string{"PATH=" + filepath.Dir(n.Bin.Containerd) + ":" + os.Getenv("PATH"), ownerEnv + "=" + strconv.Itoa(os.Getpid())}
	p, err := n.spawn("containerd", env, n.Bin.Containerd, "--config", n.path("etc", "containerd.toml"), "--log-level", "info")
	if err != nil {
		return err
	}
	return n.waitFor(ctx, "containerd to answer", 60*time.Second, p, func() (bool, error) {
		_, err := n.Ctr(ctx, "version")
		return err == nil, nil
	})
}

// StopContainerd stops containerd (SIGTERM); pods keep running in their shims.
func (n *Node) StopContainerd() { n.stopProc("containerd", 10*time.Second) }

// StartKubelet starts the kubelet and waits until the Node is Ready.
func (n *Node) StartKubelet(ctx context.Context) error {
	p, err := n.spawn("kubelet", []string{ownerEnv + "=" + strconv.Itoa(os.Getpid())}, n.Bin.Kubelet,
		"--config="+n.path("etc", "kubelet.yaml"),
		"--kubeconfig="+n.path("etc", "kubeconfig"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.IP,
		"--cert-dir="+n.path("pki"),
		"--v=2")
	if err != nil {
		return err
	}
	// After a restart the Node is still Ready from the old kubelet: wait
	// for the new one's health endpoint, then for a Ready heartbeat of its own.
	started := metav1.NewTime(time.Now().Truncate(time.Second))
	return n.waitFor(ctx, "node "+n.Name+" to be Ready", 2*time.Minute, p, func() (bool, error) {
		if !n.kubeletHealthy() {
			return false, nil
		}
		node, err := n.cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue && !c.LastHeartbeatTime.Before(&started) {
				return true, nil
			}
		}
		return false, nil
	})
}

// kubeletHealthy asks the kubelet's healthz endpoint (127.0.0.1:10248 in
// the node's network namespace).
func (n *Node) kubeletHealthy() bool {
	c, err := n.netns.dial("127.0.0.1:10248")
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n"); err != nil {
		return false
	}
	b, _ := io.ReadAll(c)
	return strings.HasPrefix(string(b), "HTTP/1.0 200") || strings.HasPrefix(string(b), "HTTP/1.1 200")
}

// StopKubelet stops the kubelet (SIGTERM); pods keep running.
func (n *Node) StopKubelet() { n.stopProc("kubelet", 10*time.Second) }

func (n *Node) stopProc(name string, grace time.Duration) {
	n.mu.Lock()
	p := n.procs[name]
	n.mu.Unlock()
	if p != nil {
		p.stop(grace)
	}
}

// waitFor polls cond until it holds, p exits (an error with its last log
// lines), ctx ends or d passes.
func (n *Node) waitFor(ctx context.Context, what string, d time.Duration, p *process, cond func() (bool, error)) error {
	deadline := time.Now().Add(d)
	for {
		if err := p.exited(); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(p.log)
			return fmt.Errorf("waiting for %s: not after %s; last lines of %s:\n%s", what, d, p.log, LastLines(string(b), 25))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Ctr runs ctr against the node's containerd in its k8s.io namespace.
func (n *Node) Ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.Bin.Ctr, append([]string{"--address", n.ContainerdSocket(), "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Dial connects, over TCP, to addr as seen from inside the node's network
// namespace (a pod's IP, a hostNetwork port); an http.Transport can use it
// as its DialContext.
func (n *Node) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if network != "tcp" && network != "tcp4" {
		return nil, fmt.Errorf("node %s: dial %s %s: only tcp", n.Name, network, addr)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return n.netns.dial(addr)
}

// ImportImage imports an OCI image tarball (and unpacks it for the CRI).
func (n *Node) ImportImage(ctx context.Context, tarball string) error {
	_, err := n.Ctr(ctx, "images", "import", tarball)
	return err
}

// Logs returns a component's log ("containerd", "kubelet").
func (n *Node) Logs(component string) string {
	b, _ := os.ReadFile(n.path("logs", component+".log"))
	return string(b)
}

// ---- teardown ----

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
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := n.cgroupPids()
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
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes left after 30s of SIGKILL: %v", pids)
		}
		for pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cgroupPids are the processes in every cgroup under the node's root.
func (n *Node) cgroupPids() map[int]bool {
	pids := map[int]bool{}
	dirs, _ := cgroupMounts()
	for _, d := range dirs {
		_ = filepath.WalkDir(filepath.Join(d, n.cgroupRoot), func(path string, e os.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
					pids[pid] = true
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroups removes the node's cgroup root in every hierarchy,
// deepest first (a cgroup goes once its last task has exited).
func (n *Node) removeCgroups() error {
	dirs, err := cgroupMounts()
	if err != nil {
		return err
	}
	var left []string
	for _, d := range dirs {
		root := filepath.Join(d, n.cgroupRoot)
		var all []string
		_ = filepath.WalkDir(root, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, path)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- {
			var err error
			for try := 0; try < 50; try++ {
				if err = syscall.Rmdir(all[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil {
				left = append(left, fmt.Sprintf("%s (%v)", all[i], err))
			}
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("cgroups not removed: %s", strings.Join(left, ", "))
	}
	return nil
}

// ControlPlaneOptions are what a control plane needs for a real node:
// service account tokens for pods (the driver's in-cluster client) and the
// kubelet dialed at its InternalIP (its Hostname, the node name, does not
// resolve). Run cluster.StartNodeControllers beside StartControllers.
func ControlPlaneOptions() cluster.ControlPlaneOptions {
	return cluster.ControlPlaneOptions{
		ServiceAccounts: true,
		ExtraFlags:      []string{"--kubelet-preferred-address-types=InternalIP"},
	}
}
