package vm

// TestVMNode: the real node of test/node (kubelet v1.37.2, containerd
// 2.4.2, runc) inside the VM, on Debian's kernel with its rdma cgroup
// controller and Soft-RoCE, registered with an in-process control plane
// here. The driver is installed by its Helm chart from the image `make
// image` builds; its init container installs rdma-dra-hook on the guest,
// containerd's runc runs it for a claim's hcaHandles, and the container
// reads its own rdma.max back and finds a second verbs context refused.
// What the containers saw comes back as their termination messages (the
// API server cannot dial the guest's kubelet for pods/log).

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/node"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
	"github.com/rdma-dra/rdma-dra-driver/test/vm/nodeguest"
)

const (
	vmNodeName    = "rdma-vm-node"
	vmNodeDone    = "rdma-vm-node-done"
	vmNodeTimeout = 20 * time.Minute
	driverName    = "rdma.dra.dev"
	// The guest's paths of what the host puts into the image.
	guestNodeCache  = "/node-cache"
	guestNodeTest   = "/guest/nodeguest.test"
	guestNodeConfig = "/etc/rdma-vm-node.json"
	guestDriverTar  = "/images/rdma-dra-driver.tar"
	guestToolsTar   = "/images/rdma-tools.tar"
)

func TestVMNode(t *testing.T) {
	v := startVMNode(t)
	defer v.finish() // before the cleanups: it reports the guest's tests as subtests
	v.installDriver()
	v.limits()
	v.pingpong()
}

// startVMNode builds what the guest runs, starts the control plane, boots
// the VM and waits for its node to be Ready.
func startVMNode(t *testing.T) *vmCluster {
	v := newVMCluster(t)
	files := v.nodeFiles()
	files = append(files, v.nodeConfig(guestNodeConfig, nodeguest.Config{Node: vmNodeName}))
	im := v.image(files, []string{nodeguest.ConfigEnv + "=" + guestNodeConfig}, vmNodeTimeout)
	v.boot(&Boot{Image: im, MemMB: 4096}, vmNodeName)
	v.waitNodeReady(vmNodeName)
	return v
}

// newVMCluster skips where no VM can run, else starts the control plane
// the guests' nodes join.
func newVMCluster(t *testing.T) *vmCluster {
	cache := requireVM(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	v := &vmCluster{t: t, ctx: ctx, cancel: cancel, dir: t.TempDir(), start: time.Now(), cacheDir: cache.Dir, cache: cache}
	var err error
	v.cp, err = node.StartControlPlane(ctx, t, filepath.Join(v.dir, "cp"))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// nodeFiles is what a node's guest runs: the node's binaries (built once,
// cached), the driver's and the tools' images, and the guest test that
// keeps the node up.
func (v *vmCluster) nodeFiles() []GuestFile {
	t := v.t
	cached, err := node.CachedFiles(t.Logf)
	if err != nil {
		t.Skipf("the node's binaries cannot be built here: %v", err)
	}
	var files []GuestFile
	for _, f := range cached {
		files = append(files, GuestFile{Path: filepath.Join(guestNodeCache, f.Rel), Src: f.Src})
	}
	image, err := node.BuildDriverImage(v.dir)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(v.dir, "nodeguest.test")
	cmd := exec.Command("go", "test", "-c", "-o", bin, "./nodeguest")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the guest's node test (go test -c ./nodeguest): %v\n%s", err, out)
	}
	tools := filepath.Join(v.dir, "rdma-tools.tar")
	if err := v.cache.ToolsImage(v.ctx, tools); err != nil {
		t.Fatal(err)
	}
	return append(files, GuestFile{Path: guestDriverTar, Src: image}, GuestFile{Path: guestToolsTar, Src: tools},
		GuestFile{Path: guestNodeTest, Src: bin})
}

// nodeConfig writes a guest's nodeguest.Config, to be at path in the
// image: the API server at QEMU's gateway to the host's loopback, checked
// against the name the host's clients use, and the node's images.
func (v *vmCluster) nodeConfig(path string, cfg nodeguest.Config) GuestFile {
	u, err := url.Parse(v.cp.Config.Host)
	if err != nil {
		v.t.Fatal(err)
	}
	ca, err := v.cp.ServingCA()
	if err != nil {
		v.t.Fatal(err)
	}
	if v.cp.Config.BearerToken == "" {
		v.t.Fatal("the control plane's client has no bearer token for the guest's node")
	}
	cfg.Server, cfg.ServerName, cfg.CA, cfg.Token = "https://10.0.2.2:"+u.Port(), u.Hostname(), ca, v.cp.Config.BearerToken
	cfg.Images, cfg.Done = []string{guestDriverTar, guestToolsTar}, vmNodeDone
	b, err := json.Marshal(cfg)
	if err != nil {
		v.t.Fatal(err)
	}
	src := filepath.Join(v.dir, filepath.Base(path))
	if err := os.WriteFile(src, b, 0o600); err != nil {
		v.t.Fatal(err)
	}
	return GuestFile{Path: path, Src: src}
}

// image builds the nodes' image: files, and the guest test run with env
// for at most timeout (less a minute for the host's side to finish).
func (v *vmCluster) image(files []GuestFile, env []string, timeout time.Duration) *Image {
	im, err := v.cache.Build(v.ctx, v.dir, ImageSpec{Files: files, Prog: guestNodeTest,
		Args: []string{"-test.v", "-test.count=1", "-test.timeout=" + (timeout - time.Minute).String()},
		Env:  append([]string{"RDMA_NODE_CACHE=" + guestNodeCache, "HOME=/root"}, env...),
		// Containers' root filesystems (overlayfs) and the CNI bridge.
		Modules: []string{"overlay", "bridge", "veth"}})
	if err != nil {
		v.t.Fatalf("building the VM image: %v", err)
	}
	v.accel = chooseAccel(v.ctx, v.t, v.cacheDir, im)
	v.t.Logf("kernel %s, %s; builds and image took %v", im.Release, v.accel, time.Since(v.start).Round(time.Millisecond))
	v.timeout = timeout
	return im
}

// boot starts b in the background as node's guest; the test's cleanup
// stops it and, on a failure, prints its console's last lines.
func (v *vmCluster) boot(b *Boot, node string) {
	t := v.t
	g := &vmGuest{node: node, booted: make(chan struct{})}
	b.Dir = filepath.Join(v.dir, node)
	if err := os.MkdirAll(b.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b.Accel, b.HostNet, b.Timeout = v.accel, true, v.timeout
	b.Console = func(l string) { g.mu.Lock(); g.console = append(g.console, l); g.mu.Unlock() }
	b.Output = func(l string) {
		if strings.HasPrefix(l, "=== RUN") || endLine.MatchString(l) || strings.Contains(l, "node_test.go") {
			t.Logf("%s| %s", node, l)
		}
	}
	v.guests = append(v.guests, g)
	go func() { g.res, g.bootErr = b.Run(v.ctx); close(g.booted) }()
	t.Cleanup(func() {
		v.cancel()
		<-g.booted
		if t.Failed() {
			g.mu.Lock()
			defer g.mu.Unlock()
			t.Logf("%s's console (last lines):\n%s", node, strings.Join(tail(g.console, 40), "\n"))
		}
	})
}

// waitNodeReady waits for the guest's node to be Ready.
func (v *vmCluster) waitNodeReady(name string) {
	v.wait("node "+name+" Ready", 10*time.Minute, func() (bool, string) {
		no, err := v.cp.Client.CoreV1().Nodes().Get(v.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range no.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, c.Message
			}
		}
		return false, "no Ready condition"
	})
	v.t.Logf("node %s Ready %s after the start", name, time.Since(v.start).Round(100*time.Millisecond))
}

// installDriver installs the chart in shared mode and waits for the
// driver, then for rxe0 of the guest's kernel in its slice with the
// capacities only a kernel with the rdma controller gets.
func (v *vmCluster) installDriver() {
	t, ctx, cp := v.t, v.ctx, v.cp
	// rxe0 is a software device: the chart's classes leave those out unless asked.
	v.installChart(`{"image":{"tag":"dev"},"sharing":"shared","deviceClasses":{"softwareDevices":true}}`, 1)
	var handles string
	v.wait("the node's ResourceSlice with rxe0's hcaHandles", 2*time.Minute, func() (bool, string) {
		slices, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, s := range slices.Items {
			if s.Spec.Driver != driverName || s.Spec.NodeName == nil || *s.Spec.NodeName != vmNodeName {
				continue
			}
			for _, d := range s.Spec.Devices {
				seen = append(seen, d.Name)
				if c, ok := d.Capacity[driverName+"/hcaHandles"]; ok && d.Name == "rxe0" {
					handles = c.Value.String()
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("devices %v", seen)
	})
	t.Logf("rxe0 publishes hcaHandles %s", handles)
}

// limits: two pods share rxe0, one claim consuming one hcaHandle (and
// the chart's default of 50000 objects), one asking none, which gets the
// chart's defaults (50 handles, 50000 objects). The chart's hook, run by containerd's runc, sets each
// container's rdma.max and its pod's; each container reads its own and
// asks the kernel for two verbs contexts.
func (v *vmCluster) limits() {
	t := v.t
	script := shCommand("contexts.sh", guestNodeTest)
	limited := v.claimPod("limited", node.BusyboxImage, script, map[string]int64{"hcaHandles": 1})
	defaults := v.claimPod("defaults", node.BusyboxImage, script, nil)
	msgs := v.terminationMessages(limited, defaults)
	for _, c := range []struct {
		pod  string
		want []string
	}{
		{limited, []string{"rdma.max: rxe0 hca_handle=1 hca_object=50000", "context 1 on /dev/infiniband/uverbs0: ok",
			"context 2 on /dev/infiniband/uverbs0: resource temporarily unavailable", "contexts exit 1"}},
		{defaults, []string{"rdma.max: rxe0 hca_handle=50 hca_object=50000", "context 1 on /dev/infiniband/uverbs0: ok",
			"context 2 on /dev/infiniband/uverbs0: ok", "contexts exit 0"}},
	} {
		t.Logf("%s's container said:\n%s", c.pod, msgs[c.pod])
		for _, w := range c.want {
			if !strings.Contains(msgs[c.pod], w) {
				t.Errorf("%s's container: no %q in what it said", c.pod, w)
			}
		}
	}
}

// pingpong moves real bytes through the whole chain: two pods' claims
// share rxe0, the kubelet prepares them, containerd applies their CDI
// specs, and ibv_rc_pingpong (rdma-core from the tools image) runs between
// the containers with the GID index the driver put into their environment.
func (v *vmCluster) pingpong() {
	t := v.t
	const port = 18515
	server := v.claimPod("pp-server", ToolsImageName, shCommand("pingpong-pod.sh", strconv.Itoa(port)), nil)
	client := v.claimPod("pp-client", ToolsImageName, shCommand("pingpong-pod.sh", strconv.Itoa(port), "127.0.0.1"), nil)
	msgs := v.terminationMessages(server, client)
	transfer := regexp.MustCompile(`(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec`)
	for _, pod := range []string{server, client} {
		out := msgs[pod]
		t.Logf("%s's container said:\n%s", pod, out)
		for _, w := range []string{"devices: rdma_cm uverbs0 ", "pingpong exit 0"} {
			if !strings.Contains(out, w) {
				t.Errorf("%s's container: no %q in what it said", pod, w)
			}
		}
		if regexp.MustCompile(`rxe1 \(not claimed\): exit 0`).MatchString(out) {
			t.Errorf("%s's container opened rxe1, which its claim does not hold", pod)
		}
		if !regexp.MustCompile(`NCCL_IB_GID_INDEX=\d+ `).MatchString(out) {
			t.Errorf("%s's container has no NCCL_IB_GID_INDEX from the driver", pod)
		}
		if m := transfer.FindStringSubmatch(out); m == nil {
			t.Errorf("%s's container: no transfer reported", pod)
		} else {
			t.Logf("%s: %s bytes in %s s = %s Mbit/s", pod, m[1], m[2], m[3])
		}
	}
}

// installChart installs the chart with values and waits for a Ready
// driver pod on each of the nodes.
func (v *vmCluster) installChart(values string, nodes int) {
	installed := time.Now()
	if _, err := cluster.InstallChart(v.ctx, v.cp, v.dir, "rdma", "rdma-system", values); err != nil {
		v.t.Fatal(err)
	}
	v.waitDrivers(nodes, installed)
}

// waitDrivers waits for a Ready driver pod on each of the nodes.
func (v *vmCluster) waitDrivers(nodes int, installed time.Time) {
	t, ctx, cp := v.t, v.ctx, v.cp
	v.wait(fmt.Sprintf("%d driver pods Ready", nodes), 5*time.Minute, func() (bool, string) {
		pods, err := cp.Client.CoreV1().Pods("rdma-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=rdma"})
		if err != nil {
			return false, err.Error()
		}
		onNodes := map[string]bool{}
		var why []string
		for _, p := range pods.Items {
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			}
			if ready {
				onNodes[p.Spec.NodeName] = true
				continue
			}
			why = append(why, fmt.Sprintf("%s on %q: phase %s, init %+v, containers %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.InitContainerStatuses, p.Status.ContainerStatuses))
		}
		return len(onNodes) == nodes, fmt.Sprintf("Ready on %d of %d nodes; %s", len(onNodes), nodes, strings.Join(why, "; "))
	})
	t.Logf("driver Ready on %d node(s) %s after the chart's install", nodes, time.Since(installed).Round(100*time.Millisecond))
	pods, err := cp.Client.CoreV1().Pods("rdma-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=rdma"})
	if err != nil {
		t.Logf("listing the driver pods for their timeline: %v", err)
		return
	}
	events, err := cp.Client.CoreV1().Events("rdma-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("listing the driver pods' events: %v", err)
	}
	for _, p := range pods.Items {
		var evs []corev1.Event
		if events != nil {
			for _, e := range events.Items {
				if e.InvolvedObject.UID == p.UID {
					evs = append(evs, e)
				}
			}
		}
		t.Logf("%s on %s: %s", p.Name, p.Spec.NodeName, podTimeline(&p, evs, installed))
	}
}

// podTimeline says when, after since, a pod passed each step of its
// start: scheduled, its containers started and ended, each condition, and
// the kubelet's events; where a slow start spent its time.
func podTimeline(p *corev1.Pod, events []corev1.Event, since time.Time) string {
	type step struct {
		at   time.Time
		what string
	}
	var steps []step
	add := func(at metav1.Time, what string) {
		if !at.IsZero() {
			steps = append(steps, step{at.Time, what})
		}
	}
	add(p.CreationTimestamp, "created")
	for _, c := range p.Status.Conditions {
		add(c.LastTransitionTime, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, c := range list {
			if r := c.State.Running; r != nil {
				add(r.StartedAt, c.Name+" running")
			}
			if x := c.State.Terminated; x != nil {
				add(x.StartedAt, c.Name+" started")
				add(x.FinishedAt, fmt.Sprintf("%s exited %d", c.Name, x.ExitCode))
			}
		}
	}
	for _, e := range events {
		at := e.LastTimestamp
		if at.IsZero() {
			at = metav1.NewTime(e.EventTime.Time)
		}
		what := e.Reason
		if e.Count > 1 {
			what += fmt.Sprintf(" x%d", e.Count)
		}
		if e.Type == corev1.EventTypeWarning {
			what += " (" + e.Message + ")"
		}
		add(at, what)
	}
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].at.Before(steps[j].at) })
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = fmt.Sprintf("+%s %s", s.at.Sub(since).Round(time.Second), s.what)
	}
	return strings.Join(out, ", ")
}

// finish tells the guest the host is done (after a failure: print your
// logs) and waits for its tests to end, each reported as a subtest.
func (v *vmCluster) finish() {
	t := v.t
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: vmNodeDone}, Data: map[string]string{"failed": fmt.Sprint(t.Failed())}}
	if _, err := v.cp.Client.CoreV1().ConfigMaps("default").Create(v.ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Errorf("telling the guests the host is done: %v", err)
		return
	}
	for _, g := range v.guests {
		select {
		case <-g.booted:
		case <-time.After(5 * time.Minute):
			t.Errorf("%s's guest did not power off within 5 minutes of the host being done", g.node)
			continue
		}
		if g.bootErr != nil {
			t.Errorf("%s's VM: %v", g.node, g.bootErr)
			continue
		}
		t.Logf("%s's VM ran %v", g.node, g.res.Elapsed.Round(time.Second))
		if len(v.guests) == 1 {
			reportGuestTests(t, g.res)
		} else {
			t.Run(g.node, func(t *testing.T) { reportGuestTests(t, g.res) })
		}
	}
}

// vmCluster is the host's side of the node in the guest.
type vmCluster struct {
	t        *testing.T
	ctx      context.Context
	cancel   context.CancelFunc
	cp       *cluster.ControlPlane
	dir      string
	start    time.Time
	cacheDir string
	cache    *Cache
	accel    string
	timeout  time.Duration
	guests   []*vmGuest
}

// vmGuest is one booted guest running a node.
type vmGuest struct {
	node    string
	booted  chan struct{} // closed when the VM has ended, with res and bootErr
	res     *Result
	bootErr error
	mu      sync.Mutex
	console []string
}

// wait polls cond every 250 ms until it holds; a guest powering off or
// d passing fails the test with cond's last word.
func (v *vmCluster) wait(what string, d time.Duration, cond func() (bool, string)) {
	v.t.Helper()
	err := poll.Until(v.ctx, what, 250*time.Millisecond, d, func(context.Context) (bool, string, error) {
		ok, why := cond()
		if ok {
			return true, "", nil
		}
		for _, g := range v.guests {
			select {
			case <-g.booted:
				return false, why, fmt.Errorf("%s's VM ended (%v; %s)", g.node, g.bootErr, why)
			default:
			}
		}
		return false, why, nil
	})
	if err != nil {
		v.t.Fatal(err)
	}
}

// claimPod creates a claim for rxe0 (the HCA on eth0) consuming the given capacities and a
// hostNetwork pod running script in image with it; the guest's test binary is at
// the same path in the container (hostPath), for its uverbs helper.
func (v *vmCluster) claimPod(name, image string, command []string, consume map[string]int64) string {
	v.t.Helper()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: "hca." + driverName,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			// rxe0 is the RoCE HCA on eth0 (siw0, when built, is iWARP on it).
			Expression: fmt.Sprintf(`device.attributes[%[1]q].netdev == "eth0" && device.attributes[%[1]q].transport == "roce"`, driverName)}}}}
	if len(consume) > 0 {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, n := range consume {
			req.Capacity.Requests[resourceapi.QualifiedName(driverName+"/"+k)] = *resource.NewQuantity(n, resource.DecimalSI)
		}
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "hca", Exactly: req}}}}}
	if _, err := v.cp.Client.ResourceV1().ResourceClaims("default").Create(v.ctx, claim, metav1.CreateOptions{}); err != nil {
		v.t.Fatal(err)
	}
	hostPath := corev1.HostPathDirectory
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			HostNetwork:   true,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         command,
				SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"IPC_LOCK"}}},
				Resources:       corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "hca"}}},
				VolumeMounts:    []corev1.VolumeMount{{Name: "guest", MountPath: filepath.Dir(guestNodeTest), ReadOnly: true}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "hca", ResourceClaimName: &name}},
			Volumes: []corev1.Volume{{Name: "guest", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: filepath.Dir(guestNodeTest), Type: &hostPath}}}},
		}}
	if _, err := v.cp.Client.CoreV1().Pods("default").Create(v.ctx, pod, metav1.CreateOptions{}); err != nil {
		v.t.Fatal(err)
	}
	return name
}

// terminationMessages waits for the pods (of namespace default) to
// succeed or fail and returns what each container wrote to its
// termination log.
func (v *vmCluster) terminationMessages(pods ...string) map[string]string {
	v.t.Helper()
	return v.terminationMessagesIn("default", pods...)
}

// terminationMessagesIn is terminationMessages in namespace ns.
func (v *vmCluster) terminationMessagesIn(ns string, pods ...string) map[string]string {
	v.t.Helper()
	out := map[string]string{}
	for _, name := range pods {
		v.wait("pod "+ns+"/"+name+" to end", 5*time.Minute, func() (bool, string) {
			p, err := v.cp.Client.CoreV1().Pods(ns).Get(v.ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, s := range p.Status.ContainerStatuses {
				if s.State.Terminated != nil {
					out[name] = s.State.Terminated.Message
					return true, ""
				}
			}
			return false, fmt.Sprintf("phase %s, conditions %+v, containers %+v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
		})
	}
	return out
}

func tail(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}
