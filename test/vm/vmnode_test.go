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
	if os.Getenv("RDMA_DRA_VM") == "0" {
		t.Skip("the environment sets RDMA_DRA_VM=0: the VM suite is switched off on this machine")
	}
	if ok, why := Available(); !ok {
		t.Skip("no VM on this machine: " + why)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := t.TempDir()
	start := time.Now()

	// What the guest runs: the node's binaries (built once, cached), the
	// driver's and the tools' images, and the guest test that keeps the
	// node up.
	cached, err := node.CachedFiles(t.Logf)
	if err != nil {
		t.Skipf("the node's binaries cannot be built here: %v", err)
	}
	var files []GuestFile
	for _, f := range cached {
		files = append(files, GuestFile{Path: filepath.Join(guestNodeCache, f.Rel), Src: f.Src})
	}
	image, err := node.BuildDriverImage(dir)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "nodeguest.test")
	cmd := exec.Command("go", "test", "-c", "-o", bin, "./nodeguest")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the guest's node test (go test -c ./nodeguest): %v\n%s", err, out)
	}
	cacheDir, err := DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	cache := &Cache{Dir: cacheDir, Log: t.Logf}
	tools := filepath.Join(dir, "rdma-tools.tar")
	if err := cache.ToolsImage(ctx, tools); err != nil {
		t.Fatal(err)
	}
	files = append(files, GuestFile{Path: guestDriverTar, Src: image}, GuestFile{Path: guestToolsTar, Src: tools},
		GuestFile{Path: guestNodeTest, Src: bin})

	cp, err := node.StartControlPlane(ctx, t, filepath.Join(dir, "cp"))
	if err != nil {
		t.Fatal(err)
	}
	cfgFile, err := guestNodeConfigFile(dir, cp)
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, GuestFile{Path: guestNodeConfig, Src: cfgFile})

	im, err := cache.Build(ctx, dir, ImageSpec{Files: files, Prog: guestNodeTest,
		Args: []string{"-test.v", "-test.count=1", "-test.timeout=" + (vmNodeTimeout - time.Minute).String()},
		Env:  []string{"RDMA_NODE_CACHE=" + guestNodeCache, nodeguest.ConfigEnv + "=" + guestNodeConfig, "HOME=/root"},
		// Containers' root filesystems (overlayfs) and the CNI bridge.
		Modules: []string{"overlay", "bridge", "veth"}})
	if err != nil {
		t.Fatalf("building the VM image: %v", err)
	}
	accel := chooseAccel(ctx, t, cacheDir, im)
	t.Logf("kernel %s, %s; builds and image took %v", im.Release, accel, time.Since(start).Round(time.Millisecond))

	v := &vmCluster{t: t, ctx: ctx, cp: cp, dir: dir, booted: make(chan struct{})}
	var mu sync.Mutex
	var console []string
	boot := &Boot{Image: im, Dir: dir, Accel: accel, MemMB: 4096, HostNet: true, Timeout: vmNodeTimeout,
		Console: func(l string) { mu.Lock(); console = append(console, l); mu.Unlock() },
		Output: func(l string) {
			if strings.HasPrefix(l, "=== RUN") || endLine.MatchString(l) || strings.Contains(l, "node_test.go") {
				t.Logf("guest| %s", l)
			}
		},
	}
	go func() { v.res, v.bootErr = boot.Run(ctx); close(v.booted) }()
	t.Cleanup(func() {
		cancel()
		<-v.booted
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			t.Logf("the guest's console (last lines):\n%s", strings.Join(tail(console, 40), "\n"))
		}
	})

	v.wait("node "+vmNodeName+" Ready", 10*time.Minute, func() (bool, string) {
		no, err := cp.Client.CoreV1().Nodes().Get(ctx, vmNodeName, metav1.GetOptions{})
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
	t.Logf("node %s Ready %s after the start", vmNodeName, time.Since(start).Round(100*time.Millisecond))
	return v
}

// installDriver installs the chart in shared mode and waits for the
// driver, then for rxe0 of the guest's kernel in its slice with the
// capacities only a kernel with the rdma controller gets.
func (v *vmCluster) installDriver() {
	t, ctx, cp := v.t, v.ctx, v.cp
	installed := time.Now()
	if _, err := cluster.InstallChart(ctx, cp, v.dir, "rdma", "rdma-system", `{"image":{"tag":"dev"},"sharing":"shared"}`); err != nil {
		t.Fatal(err)
	}
	v.wait("the driver pod Ready", 5*time.Minute, func() (bool, string) {
		pods, err := cp.Client.CoreV1().Pods("rdma-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=rdma"})
		if err != nil || len(pods.Items) == 0 {
			return false, fmt.Sprintf("no pod yet (%v)", err)
		}
		p := pods.Items[0]
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("phase %s, init %+v, containers %+v", p.Status.Phase, p.Status.InitContainerStatuses, p.Status.ContainerStatuses)
	})
	t.Logf("driver Ready %s after the chart's install", time.Since(installed).Round(100*time.Millisecond))

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

// limits: two pods share rxe0, one claim consuming one hcaHandle, one
// asking none. The chart's hook, run by containerd's runc, sets the first
// container's rdma.max; each container reads its own and asks the kernel
// for two verbs contexts.
func (v *vmCluster) limits() {
	t := v.t
	script := `cg=$(cut -d: -f3 /proc/self/cgroup)
{ echo "rdma.max: $(grep rxe0 /sys/fs/cgroup${cg%/}/rdma.max)"
  RDMA_DRA_VM_HELPER=uverbs-contexts UVERBS=$(ls /dev/infiniband/uverbs*) N=2 ` + guestNodeTest + ` 2>&1
  echo "contexts exit $?"; } > /dev/termination-log; cat /dev/termination-log`
	limited := v.claimPod("limited", node.BusyboxImage, script, map[string]int64{"hcaHandles": 1})
	unlimited := v.claimPod("unlimited", node.BusyboxImage, script, nil)
	msgs := v.terminationMessages(limited, unlimited)
	for _, c := range []struct {
		pod  string
		want []string
	}{
		{limited, []string{"rdma.max: rxe0 hca_handle=1 hca_object=max", "context 1 on /dev/infiniband/uverbs0: ok",
			"context 2 on /dev/infiniband/uverbs0: resource temporarily unavailable", "contexts exit 1"}},
		{unlimited, []string{"rdma.max: rxe0 hca_handle=max hca_object=max", "context 1 on /dev/infiniband/uverbs0: ok",
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
	pingpong := fmt.Sprintf("ibv_rc_pingpong -d rxe0 -g \"$NCCL_IB_GID_INDEX\" -p %d -n 500 -s 4096", port)
	head := `echo "NCCL_IB_GID_INDEX=$NCCL_IB_GID_INDEX devices: $(ls /dev/infiniband | tr '\n' ' ')"
o=$(ibv_devinfo -d rxe1 2>&1); echo "rxe1 (not claimed): exit $? $(echo "$o" | tail -n 1)"
`
	server := v.claimPod("pp-server", ToolsImageName, `{ `+head+pingpong+` 2>&1; echo "pingpong exit $?"; } > /dev/termination-log`, nil)
	client := v.claimPod("pp-client", ToolsImageName, fmt.Sprintf(`{ `+head+`for i in $(seq 600); do grep -q ':%04X 00000000:0000 0A' /proc/net/tcp && break; sleep 0.1; done
%s 127.0.0.1 2>&1; echo "pingpong exit $?"; } > /dev/termination-log`, port, pingpong), nil)
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

// guestNodeConfigFile writes the guest's nodeguest.Config: the API server
// at QEMU's gateway to the host's loopback, checked against the name the
// host's clients use.
func guestNodeConfigFile(dir string, cp *cluster.ControlPlane) (string, error) {
	u, err := url.Parse(cp.Config.Host)
	if err != nil {
		return "", err
	}
	ca, err := cp.ServingCA()
	if err != nil {
		return "", err
	}
	if cp.Config.BearerToken == "" {
		return "", fmt.Errorf("the control plane's client has no bearer token for the guest's node")
	}
	b, err := json.Marshal(nodeguest.Config{Server: "https://10.0.2.2:" + u.Port(), ServerName: u.Hostname(),
		CA: ca, Token: cp.Config.BearerToken, Node: vmNodeName, Images: []string{guestDriverTar, guestToolsTar}, Done: vmNodeDone})
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "rdma-vm-node.json")
	return p, os.WriteFile(p, b, 0o600)
}

// finish tells the guest the host is done (after a failure: print your
// logs) and waits for its tests to end, each reported as a subtest.
func (v *vmCluster) finish() {
	t := v.t
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: vmNodeDone}, Data: map[string]string{"failed": fmt.Sprint(t.Failed())}}
	if _, err := v.cp.Client.CoreV1().ConfigMaps("default").Create(v.ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Errorf("telling the guest the host is done: %v", err)
		return
	}
	select {
	case <-v.booted:
	case <-time.After(5 * time.Minute):
		t.Errorf("the guest did not power off within 5 minutes of the host being done")
		return
	}
	if v.bootErr != nil {
		t.Errorf("the VM: %v", v.bootErr)
		return
	}
	t.Logf("VM ran %v", v.res.Elapsed.Round(time.Second))
	reportGuestTests(t, v.res)
}

// vmCluster is the host's side of the node in the guest.
type vmCluster struct {
	t       *testing.T
	ctx     context.Context
	cp      *cluster.ControlPlane
	dir     string
	booted  chan struct{} // closed when the VM has ended, with res and bootErr
	res     *Result
	bootErr error
}

// wait polls cond every 250 ms until it holds; the guest powering off or
// d passing fails the test with cond's last word.
func (v *vmCluster) wait(what string, d time.Duration, cond func() (bool, string)) {
	v.t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, why := cond()
		if ok {
			return
		}
		select {
		case <-v.booted:
			v.t.Fatalf("waiting for %s: the VM ended (%s)", what, why)
		default:
		}
		if time.Now().After(deadline) {
			v.t.Fatalf("waiting for %s: not after %s: %s", what, d, why)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// claimPod creates a claim for rxe0 consuming the given capacities and a
// hostNetwork pod running script in image with it; the guest's test binary is at
// the same path in the container (hostPath), for its uverbs helper.
func (v *vmCluster) claimPod(name, image, script string, consume map[string]int64) string {
	v.t.Helper()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: "hca." + driverName,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.attributes[%q].ibdev == "rxe0"`, driverName)}}}}
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
				Command:         []string{"sh", "-c", script},
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

// terminationMessages waits for the pods to succeed or fail and returns
// what each container wrote to its termination log.
func (v *vmCluster) terminationMessages(pods ...string) map[string]string {
	v.t.Helper()
	out := map[string]string{}
	for _, name := range pods {
		v.wait("pod "+name+" to end", 5*time.Minute, func() (bool, string) {
			p, err := v.cp.Client.CoreV1().Pods("default").Get(v.ctx, name, metav1.GetOptions{})
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
