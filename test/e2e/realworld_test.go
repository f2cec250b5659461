package e2e

// realWorld: the in-process control plane (controllers, node controllers,
// scheduler) beside one real node (test/node: kubelet v1.37.2, containerd
// 2.4.2, runc) running a simulated DGX H100, with the driver's image
// imported. Scenarios install the driver with its Helm chart, run pods
// through the real kubelet and read what the containers saw from their
// logs (pods/log).

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/node"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

type realWorld struct {
	t       *testing.T // the test function's: the world outlives subtests
	ctx     context.Context
	cp      *cluster.ControlPlane
	n       *node.Node
	dir     string
	sim     *hcatest.Node
	devices map[string]hca.HCA // published device name -> HCA
	claims  *claimRecorder

	release string // the installed chart release, "" if none
	memlock string // the Helm value memlock this host allows (cluster.HostMemlock)
	objs    []*unstructured.Unstructured
}

// newRealWorld starts the control plane and the node, imports the driver's
// image and builds the simulated node; it installs nothing. It skips, with
// the reason, where a node cannot run. opts adjust the node's options.
func newRealWorld(t *testing.T, opts ...func(*node.Options)) *realWorld {
	t.Helper()
	if err := node.Check(); err != nil {
		t.Skipf("needs a machine that can run a real node (root, runc, iproute2, static busybox): %v", err)
	}
	if _, err := node.EnsureBinaries(t.Logf); err != nil {
		t.Skipf("the node's binaries cannot be built here: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	image := driverImage(t)
	spec, err := hcatest.Preset("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := hcatest.Build(filepath.Join(dir, "hca"), spec)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := hca.Discover(hca.WithSysfsRoot(sim.SysfsRoot), hca.WithDevRoot(sim.DevRoot))
	if err != nil {
		t.Fatal(err)
	}
	cp, err := node.StartControlPlane(ctx, t, filepath.Join(dir, "cp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	nodeOpts := node.Options{Images: []string{image}}
	for _, o := range opts {
		o(&nodeOpts)
	}
	n, err := node.Start(ctx, t, cp, nodeOpts)
	if err != nil {
		t.Fatal(err)
	}
	memlock, why, err := cluster.HostMemlock()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("memlock the hook gives containers here: %s (%s)", memlock, why)
	w := &realWorld{t: t, ctx: ctx, cp: cp, n: n, dir: dir, sim: sim, devices: devices.Published(inv), claims: watchClaims(ctx, t, cp), memlock: memlock}
	t.Cleanup(func() {
		if t.Failed() && w.release != "" {
			t.Logf("driver log (%s):\n%s\nits previous container's:\n%s", w.release, w.driverLog(false), w.driverLog(true))
		}
	})
	return w
}

// values puts the hook in the world's own directory: every claim's spec
// names it (the hostNetwork check), and another test's node must not
// replace it under this one. The memlock is what this host lets the hook
// give (cluster.HostMemlock).
func (w *realWorld) values(extra string) string {
	return fmt.Sprintf(`{"image":{"tag":"dev"},"sysfsRoot":%q,"devRoot":%q,"hook":{"dir":%q},"memlock":%q%s}`,
		w.sim.SysfsRoot, w.sim.DevRoot, filepath.Join(w.dir, "hook-bin"), w.memlock, extra)
}

// install installs the chart as release with extra values (a JSON object's
// members, each with a leading comma) and waits for the driver pod to be
// Ready and for every HCA's device in the node's ResourceSlices.
func (w *realWorld) install(t *testing.T, release, extra string) {
	t.Helper()
	w.release = release // for the logs on failure
	w.objs = installDriver(w.ctx, t, w.cp, w.n, w.dir, release, w.values(extra))
	poll.For(t, "the ResourceSlice of "+w.n.Name, time.Minute, func() (bool, string) {
		got := sliceDevices(w.ctx, w.cp, w.n.Name)
		for name := range w.devices {
			if !slices.Contains(got, name) {
				return false, fmt.Sprintf("devices %v, want every HCA's (%d)", got, len(w.devices))
			}
		}
		return true, ""
	})
}

func (w *realWorld) uninstall(t *testing.T) {
	t.Helper()
	uninstallDriver(w.ctx, t, w.cp, w.objs)
	w.release, w.objs = "", nil
}

// ---- paths on the node ----

// cdiDir is the node's /var/run/cdi, where the driver writes its specs
// and containerd reads them.
func (w *realWorld) cdiDir() string { return filepath.Join(w.n.Dir, "run", "cdi") }

func (w *realWorld) checkpoint(t *testing.T) checkpoint.Checkpoint {
	t.Helper()
	cp, err := checkpoint.NewStore(filepath.Join(w.n.Dir, "var-lib", "kubelet", "plugins", "rdma.dra.dev", "checkpoint.json")).Load()
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// specFiles lists the node's CDI dir.
func (w *realWorld) specFiles() []string {
	entries, _ := os.ReadDir(w.cdiDir())
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// checkPrepared checks that the driver's checkpoint and its CDI specs hold
// exactly the claims with these UIDs: one claim spec each, plus the
// kubelet plugin helper's device-metadata spec each, nothing else.
func (w *realWorld) checkPrepared(t *testing.T, uids []string) {
	t.Helper()
	want := slices.Sorted(slices.Values(uids))
	var got []string
	for uid := range w.checkpoint(t).Claims {
		got = append(got, uid)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("checkpoint holds claims %v, want %v", got, want)
	}
	specs, err := cdi.NewSpecDir(w.cdiDir()).ClaimUIDs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(specs, want) {
		t.Errorf("claim CDI specs for %v, want %v", specs, want)
	}
	if files := w.specFiles(); len(files) != 2*len(want) {
		t.Errorf("CDI dir holds %v, want a claim spec and a metadata spec for each of %v", files, want)
	}
}

// ---- pods ----

// tickScript lists /dev/infiniband on one line every second, numbered:
// "tick N: rdma_cm uverbs3".
const tickScript = `i=0; while true; do i=$((i+1)); echo "tick $i: $(ls /dev/infiniband | tr '\n' ' ')"; sleep 1; done`

type tick struct {
	n    int
	devs string
}

var tickRE = regexp.MustCompile(`(?m)^tick (\d+): (.*?)\s*$`)

func ticks(log string) []tick {
	var out []tick
	for _, m := range tickRE.FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, tick{n, m[2]})
	}
	return out
}

// ensureTemplate creates the demo's ResourceClaimTemplate ib-400g (as
// demo/specs/10-job-dra.yaml does) unless it exists.
func (w *realWorld) ensureTemplate(t *testing.T) {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "ib-400g", Namespace: "default"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "hca", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: "ib.rdma.dra.dev",
				Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["rdma.dra.dev"].rateGbps >= 400`}}},
			}}},
		}}},
	}
	if _, err := w.cp.Client.ResourceV1().ResourceClaimTemplates("default").Create(w.ctx, tmpl, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// realClaimPod is a pod with its own claim from ib-400g running script in
// busybox; mutate adjusts it before it is created.
func (w *realWorld) realClaimPod(t *testing.T, name string, hostNetwork bool, script string, mutate ...func(*corev1.Pod)) {
	t.Helper()
	w.ensureTemplate(t)
	pod := claimPod(name, hostNetwork, script)
	pod.Spec.TerminationGracePeriodSeconds = ptr(int64(1))
	pod.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
	for _, m := range mutate {
		m(pod)
	}
	if _, err := w.cp.Client.CoreV1().Pods("default").Create(w.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (w *realWorld) pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := w.cp.Client.CoreV1().Pods("default").Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitPhase waits until every named pod is in phase.
func (w *realWorld) waitPhase(t *testing.T, phase corev1.PodPhase, names ...string) {
	t.Helper()
	start := time.Now()
	poll.For(t, fmt.Sprintf("pods %v to be %s", names, phase), 2*time.Minute, func() (bool, string) {
		var not []string
		for _, name := range names {
			p, err := w.cp.Client.CoreV1().Pods("default").Get(w.ctx, name, metav1.GetOptions{})
			if err != nil {
				not = append(not, fmt.Sprintf("%s: %v", name, err))
				continue
			}
			if p.Status.Phase == corev1.PodFailed && phase != corev1.PodFailed {
				t.Fatalf("pod %s failed: %+v\nevents: %s", name, p.Status, w.events(name))
			}
			if p.Status.Phase != phase {
				not = append(not, fmt.Sprintf("%s %s %+v", name, p.Status.Phase, p.Status.Conditions))
			}
		}
		return len(not) == 0, strings.Join(not, "; ")
	})
	t.Logf("pods %v %s %s after the wait began", names, phase, time.Since(start).Round(10*time.Millisecond))
}

func (w *realWorld) events(name string) string {
	evs, err := w.cp.Client.CoreV1().Events("default").List(w.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	var s []string
	for _, e := range evs.Items {
		s = append(s, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
	}
	return strings.Join(s, "\n")
}

// logs is `kubectl logs [--previous]` of the pod's container c.
func (w *realWorld) logs(t *testing.T, pod string, previous bool) string {
	t.Helper()
	b, err := w.cp.Client.CoreV1().Pods("default").GetLogs(pod, &corev1.PodLogOptions{Container: "c", Previous: previous}).DoRaw(w.ctx)
	if err != nil {
		t.Fatalf("pods/log of %s (previous %v): %v", pod, previous, err)
	}
	return string(b)
}

// waitTicks waits until the pod's log has a tick numbered above after and
// returns its ticks.
func (w *realWorld) waitTicks(t *testing.T, pod string, after int) []tick {
	t.Helper()
	var got []tick
	poll.For(t, fmt.Sprintf("pod %s's log to go past tick %d", pod, after), 2*time.Minute, func() (bool, string) {
		b, err := w.cp.Client.CoreV1().Pods("default").GetLogs(pod, &corev1.PodLogOptions{Container: "c"}).DoRaw(w.ctx)
		if err != nil {
			return false, err.Error()
		}
		got = ticks(string(b))
		return len(got) > 0 && got[len(got)-1].n > after, fmt.Sprintf("%d ticks", len(got))
	})
	return got
}

// claimOf is the pod's one claim: its UID and allocated devices. A
// template's claim goes with its pod's end: see doneDevices.
func (w *realWorld) claimOf(t *testing.T, pod string) (string, []string) {
	t.Helper()
	p := w.pod(t, pod)
	var name string
	switch {
	case len(p.Spec.ResourceClaims) == 1 && p.Spec.ResourceClaims[0].ResourceClaimName != nil:
		name = *p.Spec.ResourceClaims[0].ResourceClaimName
	case len(p.Status.ResourceClaimStatuses) == 1 && p.Status.ResourceClaimStatuses[0].ResourceClaimName != nil:
		name = *p.Status.ResourceClaimStatuses[0].ResourceClaimName
	default:
		t.Fatalf("pod %s: claims %+v, claim statuses %+v", pod, p.Spec.ResourceClaims, p.Status.ResourceClaimStatuses)
	}
	c, err := w.cp.Client.ResourceV1().ResourceClaims("default").Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Allocation == nil {
		t.Fatalf("claim %s of pod %s is not allocated", c.Name, pod)
	}
	var devs []string
	for _, r := range c.Status.Allocation.Devices.Results {
		devs = append(devs, r.Device)
	}
	return string(c.UID), devs
}

// doneDevices are the devices the claim of a finished pod had (recorded
// while it existed).
func (w *realWorld) doneDevices(t *testing.T, pod string) []string {
	t.Helper()
	devs := w.claims.devices(pod)
	if len(devs) == 0 {
		t.Fatalf("no allocation recorded for pod %s: %s", pod, w.claims.all())
	}
	return devs
}

// uverbsOf is what a container holding these devices lists in
// /dev/infiniband, as one tick line has it.
func (w *realWorld) uverbsOf(devs ...string) string {
	names := []string{"rdma_cm"}
	for _, d := range devs {
		names = append(names, w.devices[d].Uverbs.Name)
	}
	slices.Sort(names)
	return strings.Join(names, " ")
}

// reset deletes every Job, pod and claim in default and waits for them to
// be gone; then the driver must hold nothing: an empty checkpoint and no
// CDI spec (no leak, whatever the scenario did).
func (w *realWorld) reset(t *testing.T) {
	t.Helper()
	w.clearDefault(t, 1)
	// The kubelet unprepares after the pod object may be gone.
	poll.For(t, "the driver to have unprepared everything", time.Minute, func() (bool, string) {
		return len(w.checkpoint(t).Claims) == 0 && len(w.specFiles()) == 0, fmt.Sprintf("checkpoint %d claims, CDI dir %v", len(w.checkpoint(t).Claims), w.specFiles())
	})
}

// clearDefault deletes every Job, pod (with grace seconds) and claim in
// default and waits until they are gone and the driver's checkpoint holds
// no claim.
func (w *realWorld) clearDefault(t *testing.T, grace int64) {
	t.Helper()
	bg := metav1.DeletePropagationBackground
	c := w.cp.Client
	if err := c.BatchV1().Jobs("default").DeleteCollection(w.ctx, metav1.DeleteOptions{PropagationPolicy: &bg}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().Pods("default").DeleteCollection(w.ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.ResourceV1().ResourceClaims("default").DeleteCollection(w.ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.For(t, "pods and claims in default to be gone, and the driver to hold no claim", 2*time.Minute, func() (bool, string) {
		pods, err := c.CoreV1().Pods("default").List(w.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		claims, err := c.ResourceV1().ResourceClaims("default").List(w.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		n := len(w.checkpoint(t).Claims)
		return len(pods.Items) == 0 && len(claims.Items) == 0 && n == 0, fmt.Sprintf("%d pods, %d claims, %d prepared", len(pods.Items), len(claims.Items), n)
	})
}

// scenario runs f as the subtest name, then reset (even when f fails or
// stops the subtest), then logs how long the whole took.
func (w *realWorld) scenario(t *testing.T, name string, reset, f func(t *testing.T)) {
	t.Run(name, func(t *testing.T) {
		start := time.Now()
		defer func() {
			reset(t)
			t.Logf("%s: %s", name, time.Since(start).Round(100*time.Millisecond))
		}()
		f(t)
	})
}

// ---- the driver's pod ----

// driverPods are the release's pods that are not being deleted.
func (w *realWorld) driverPods(t *testing.T) []corev1.Pod {
	t.Helper()
	l, err := w.cp.Client.CoreV1().Pods("rdma-system").List(w.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + w.release})
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			pods = append(pods, p)
		}
	}
	return pods
}

func (w *realWorld) driverPod(t *testing.T) corev1.Pod {
	t.Helper()
	pods := w.driverPods(t)
	if len(pods) != 1 {
		t.Fatalf("%d driver pods of %s, want 1", len(pods), w.release)
	}
	return pods[0]
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return p.Status.Phase == corev1.PodRunning
		}
	}
	return false
}

func (w *realWorld) driverLog(previous bool) string {
	l, err := w.cp.Client.CoreV1().Pods("rdma-system").List(w.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + w.release})
	if err != nil || len(l.Items) == 0 {
		return fmt.Sprintf("no driver pod (%v)", err)
	}
	var out []string
	for _, p := range l.Items {
		b, err := w.cp.Client.CoreV1().Pods("rdma-system").GetLogs(p.Name, &corev1.PodLogOptions{Container: "driver", Previous: previous}).DoRaw(w.ctx)
		out = append(out, fmt.Sprintf("--- %s (%v)\n%s", p.Name, err, b))
	}
	return strings.Join(out, "\n")
}

// metric reads one sample of the driver pod's /metrics (its pod IP, from
// inside the node's network namespace), e.g.
// `rdma_dra_prepare_claims_total{result="success"}`; 0 if absent.
func (w *realWorld) metric(t *testing.T, p corev1.Pod, sample string) float64 {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return w.n.Dial(ctx, network, addr)
	}}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + net.JoinHostPort(p.Status.PodIP, "9464") + "/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", p.Name, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metrics of %s: %q: %v", p.Name, sc.Text(), err)
			}
			return f
		}
	}
	return 0
}

const (
	prepareOK       = `rdma_dra_prepare_claims_total{result="success"}`
	prepareErr      = `rdma_dra_prepare_claims_total{result="error"}`
	unprepareOK     = `rdma_dra_unprepare_claims_total{result="success"}`
	prepareRepeated = `rdma_dra_prepare_repeated_claims_total`
)

// taskPid is the host pid of a container's init process (ctr task list).
func (w *realWorld) taskPid(t *testing.T, containerID string) int {
	t.Helper()
	id := strings.TrimPrefix(containerID, "containerd://")
	out, err := w.n.Ctr(w.ctx, "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == id && f[2] == "RUNNING" {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("ctr tasks ls: %q: %v", l, err)
			}
			return pid
		}
	}
	t.Fatalf("no running task %s in:\n%s", id, out)
	return 0
}

func sigkill(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", pid, err)
	}
}
