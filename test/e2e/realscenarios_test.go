package e2e

// The end-to-end scenarios on a real node (see realworld_test.go): one
// node and one driver install (exclusive sharing) for all of them, each
// scenario a subtest that leaves no pod, claim, checkpoint entry or CDI
// spec behind (reset checks that).

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

func TestRealNodeScenarios(t *testing.T) {
	t.Parallel() // a real node of its own: see parallel in main_test.go
	w := newRealWorld(t)
	nodeObj, err := w.cp.Client.CoreV1().Nodes().Get(w.ctx, w.n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := nodeObj.Status.NodeInfo
	t.Logf("node %s: kubelet %s, runtime %s, kernel %s", w.n.Name, info.KubeletVersion, info.ContainerRuntimeVersion, info.KernelVersion)
	if info.KubeletVersion != "v1.37.2" || info.ContainerRuntimeVersion != "containerd://2.4.2" {
		t.Errorf("node reports kubelet %q and runtime %q, want v1.37.2 and containerd://2.4.2", info.KubeletVersion, info.ContainerRuntimeVersion)
	}
	w.install(t, "rdma", "")

	w.scenario(t, "device-metadata", w.reset, w.deviceMetadata)
	w.scenario(t, "claim-status", w.reset, w.claimStatus)
	w.scenario(t, "pcie-root-pair", w.reset, w.pcieRootPair)
	w.scenario(t, "hostNetwork-refusal", w.reset, w.hostNetworkRefusal)
	w.scenario(t, "eight-then-nine", w.reset, w.eightThenNine)
	w.scenario(t, "container-restart", w.reset, w.containerRestart)
	w.scenario(t, "kubelet-restart", w.reset, w.kubeletRestart)
	w.scenario(t, "containerd-restart", w.reset, w.containerdRestart)
	w.scenario(t, "driver-SIGKILL", w.reset, w.driverSIGKILL)
	w.scenario(t, "rolling-update", w.reset, w.rollingUpdate)
	w.scenario(t, "port-down", w.reset, w.portDown) // last: it takes seven ports down
}

// The device metadata file (KEP-5304) as the container reads it: the
// allocated HCA with every attribute of its ResourceSlice entry, value for
// value, and the run-time keys, uverbs naming the node the container has.
func (w *realWorld) deviceMetadata(t *testing.T) {
	const mark = "--- metadata ---"
	w.realClaimPod(t, "metadata", true, "ls /dev/infiniband; echo '"+mark+"'; cat "+
		"/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/rdma/hca/rdma.dra.dev-metadata.json")
	w.waitPhase(t, corev1.PodSucceeded, "metadata")
	out := w.logs(t, "metadata", false)
	listing, file, ok := strings.Cut(out, mark+"\n")
	if !ok {
		t.Fatalf("the container printed no metadata file:\n%s", out)
	}
	// A stream of objects, one per API version, newest first.
	var md metadatav1beta1.DeviceMetadata
	if err := json.NewDecoder(strings.NewReader(file)).Decode(&md); err != nil {
		t.Fatalf("the metadata file: %v\n%s", err, file)
	}
	t.Logf("metadata file in the container (%d bytes), first object %s, %d requests", len(file), md.APIVersion, len(md.Requests))
	if md.APIVersion != "metadata.resource.k8s.io/v1beta1" || md.PodClaimName == nil || *md.PodClaimName != "rdma" ||
		len(md.Requests) != 1 || md.Requests[0].Name != "hca" || len(md.Requests[0].Devices) != 1 {
		t.Fatalf("metadata: apiVersion %q, podClaimName %v, requests %+v; want v1beta1, rdma, one request hca with one device",
			md.APIVersion, md.PodClaimName, md.Requests)
	}
	got := md.Requests[0].Devices[0]
	allocated := w.doneDevices(t, "metadata")
	if got.Driver != "rdma.dra.dev" || len(allocated) != 1 || got.Name != allocated[0] {
		t.Fatalf("metadata names device %s/%s, the claim had %v", got.Driver, got.Name, allocated)
	}
	published, err := w.cp.Client.ResourceV1().ResourceSlices().List(w.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var want map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	for _, sl := range published.Items {
		for _, d := range sl.Spec.Devices {
			if sl.Spec.Driver == got.Driver && sl.Spec.Pool.Name == got.Pool && d.Name == got.Name {
				want = d.Attributes
			}
		}
	}
	if len(want) == 0 {
		t.Fatalf("no ResourceSlice device %s in pool %s", got.Name, got.Pool)
	}
	for k, v := range want {
		if g, ok := got.Attributes[k]; !ok || !apiequality.Semantic.DeepEqual(g, v) {
			t.Errorf("metadata attribute %s = %v, the slice has %v", k, g, v)
		}
	}
	uverbs := w.devices[got.Name].Uverbs.Name
	if u := got.Attributes["rdma.dra.dev/uverbs"].StringValue; u == nil || *u != "/dev/infiniband/"+uverbs ||
		!slices.Contains(infinibandListing(listing), uverbs) {
		t.Errorf("metadata uverbs %v; the device's node is %s, the container lists %v", u, uverbs, infinibandListing(listing))
	}
	// Every field the driver knows, those the slice leaves out too
	// (docs/attributes.md), with the values discovery reads.
	all := devices.Metadata(w.devices[got.Name], w.netnsMode(t), "", devices.Options{})
	for k, v := range all {
		if g, ok := got.Attributes[resourceapi.QualifiedName(k)]; !ok || !apiequality.Semantic.DeepEqual(g, v) {
			t.Errorf("metadata attribute %s = %v (present %v), discovery has %v", k, g, ok, v)
		}
	}
	t.Logf("%s: %d slice attributes, all equal in the file; %d fields in all (slice, identity, run time), all there",
		got.Name, len(want), len(all))
}

// netnsMode is the node's RDMA netns mode as the simulated tree has it.
func (w *realWorld) netnsMode(t *testing.T) hca.NetnsMode {
	t.Helper()
	inv, err := hca.Discover(hca.WithSysfsRoot(w.sim.SysfsRoot), hca.WithDevRoot(w.sim.DevRoot))
	if err != nil {
		t.Fatal(err)
	}
	return inv.NetnsMode
}

// The claim's status.devices (KEP-4817) on the real node: while its pod
// runs, the claim's RoCE HCA with its netdev's name, the address of its
// RoCE v2 GID and its MAC as the node's sysfs has them, Ready and LinkUp;
// gone after the pod ends. The daemon runs off the host network here, so
// the addresses come from the GID table (/32, no prefix length in a GID).
func (w *realWorld) claimStatus(t *testing.T) {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "roce", Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "hca", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "roce.rdma.dra.dev"}}}}}}
	if _, err := w.cp.Client.ResourceV1().ResourceClaims("default").Create(w.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "roce", Namespace: "default"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, HostNetwork: true, TerminationGracePeriodSeconds: ptr(int64(1)),
			ResourceClaims: []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimName: ptr("roce")}},
			Containers: []corev1.Container{{Name: "c", Image: "busybox", ImagePullPolicy: corev1.PullNever, Command: []string{"sh", "-c", tickScript},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "rdma"}}}}}},
	}
	if _, err := w.cp.Client.CoreV1().Pods("default").Create(w.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitPhase(t, corev1.PodRunning, "roce")
	_, devs := w.claimOf(t, "roce")
	if len(devs) != 1 {
		t.Fatalf("claim roce got %v, want one RoCE HCA", devs)
	}
	h := w.devices[devs[0]]
	var netdev, ip string
	for _, g := range h.Ports[0].GIDs {
		if g.Index == h.Ports[0].RoCEv2GIDIndex {
			netdev, ip = g.Netdev, net.ParseIP(g.GID).String()+"/32"
		}
	}
	mac, err := os.ReadFile(filepath.Join(w.sim.SysfsRoot, "class", "net", netdev, "address"))
	if netdev == "" || err != nil {
		t.Fatalf("HCA %s: RoCE v2 GID netdev %q, its address: %v", h.Name, netdev, err)
	}
	want := resourceapi.NetworkDeviceData{InterfaceName: netdev, IPs: []string{ip}, HardwareAddress: strings.TrimSpace(string(mac))}
	var got resourceapi.AllocatedDeviceStatus
	poll.For(t, "the claim's status.devices", 30*time.Second, func() (bool, string) {
		ours := w.driverStatus(t, "roce")
		if len(ours) != 1 {
			return false, fmt.Sprintf("%+v", ours)
		}
		got = ours[0]
		return true, ""
	})
	data := "none"
	if got.Data != nil {
		data = string(got.Data.Raw)
	}
	t.Logf("claim roce: status.devices %s/%s/%s networkData %+v conditions %d data %s", got.Driver, got.Pool, got.Device,
		got.NetworkData, len(got.Conditions), data)
	if got.Pool != w.n.Name || got.Device != devs[0] || got.NetworkData == nil || !apiequality.Semantic.DeepEqual(*got.NetworkData, want) {
		t.Errorf("status.devices entry %s/%s with networkData %+v, want %s/%s with %+v", got.Pool, got.Device, got.NetworkData, w.n.Name, devs[0], want)
	}
	conds := map[string]metav1.ConditionStatus{}
	for _, c := range got.Conditions {
		conds[c.Type] = c.Status
	}
	if conds["Ready"] != metav1.ConditionTrue || conds["LinkUp"] != metav1.ConditionTrue {
		t.Errorf("conditions %+v, want Ready and LinkUp True", got.Conditions)
	}

	if err := w.cp.Client.CoreV1().Pods("default").Delete(w.ctx, "roce", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(1))}); err != nil {
		t.Fatal(err)
	}
	poll.For(t, "the driver's status.devices entry to go after the pod", time.Minute, func() (bool, string) {
		ours := w.driverStatus(t, "roce")
		return len(ours) == 0, fmt.Sprintf("%+v", ours)
	})
	if log := w.driverLog(false); strings.Contains(log, "device status") {
		t.Errorf("the driver logged a failed status write:\n%s", log)
	}
}

// driverStatus is the claim's status.devices entries of rdma.dra.dev.
func (w *realWorld) driverStatus(t *testing.T, claim string) []resourceapi.AllocatedDeviceStatus {
	t.Helper()
	c, err := w.cp.Client.ResourceV1().ResourceClaims("default").Get(w.ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ours []resourceapi.AllocatedDeviceStatus
	for _, d := range c.Status.Devices {
		if d.Driver == "rdma.dra.dev" {
			ours = append(ours, d)
		}
	}
	return ours
}

// Two HCAs on one PCIe root (matchAttribute resource.kubernetes.io/pcieRoot):
// the container sees both.
func (w *realWorld) pcieRootPair(t *testing.T) {
	applyPulling(w.ctx, t, w.cp, w.dir, "demo/specs/30-claim-pcie-pair.yaml")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pair", Namespace: "default"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, HostNetwork: true, TerminationGracePeriodSeconds: ptr(int64(1)),
			ResourceClaims: []corev1.PodResourceClaim{{Name: "hcas", ResourceClaimName: ptr("hca-pair")}},
			Containers: []corev1.Container{{Name: "c", Image: "busybox", ImagePullPolicy: corev1.PullNever, Command: []string{"sh", "-c", tickScript},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "hcas"}}}}}},
	}
	if _, err := w.cp.Client.CoreV1().Pods("default").Create(w.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitPhase(t, corev1.PodRunning, "pair")
	_, devs := w.claimOf(t, "pair") // allocated while its pod runs
	roots := w.pcieRoots(t)
	if len(devs) != 2 || devs[0] == devs[1] || roots[devs[0]] == "" || roots[devs[0]] != roots[devs[1]] {
		t.Fatalf("pair = %v (roots %v), want two IB HCAs on one PCIe root", devs, roots)
	}
	t.Logf("hca-pair: %v on %s", devs, roots[devs[0]])
	if got := w.waitTicks(t, "pair", 0)[0].devs; got != w.uverbsOf(devs...) {
		t.Errorf("pair container sees %q, want %q", got, w.uverbsOf(devs...))
	}
}

// pcieRoots maps each published device to its pcieRoot attribute.
func (w *realWorld) pcieRoots(t *testing.T) map[string]string {
	t.Helper()
	l, err := w.cp.Client.ResourceV1().ResourceSlices().List(w.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roots := map[string]string{}
	for _, s := range l.Items {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes["resource.kubernetes.io/pcieRoot"]; ok && a.StringValue != nil {
				roots[d.Name] = *a.StringValue
			}
		}
	}
	return roots
}

// A pod off the host network is refused at prepare (allowNonHostNetwork is
// false): the real kubelet's event names the switch, the pod stays Pending
// and its container never starts.
func (w *realWorld) hostNetworkRefusal(t *testing.T) {
	w.realClaimPod(t, "podnet", false, "ls /dev/infiniband")
	var msg string
	poll.For(t, "the kubelet's event for the refused prepare", time.Minute, func() (bool, string) {
		evs, err := w.cp.Client.CoreV1().Events("default").List(w.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=podnet"})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Source.Component == "kubelet" && strings.Contains(e.Message, "does not use hostNetwork") && strings.Contains(e.Message, "--allow-non-host-network") {
				msg = e.Reason + ": " + e.Message
				return true, ""
			}
		}
		return false, w.events("podnet")
	})
	t.Logf("the kubelet's event: %s", msg)
	p := w.pod(t, "podnet")
	if p.Status.Phase != corev1.PodPending || len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Waiting == nil {
		t.Errorf("refused pod: phase %s, containers %+v; want Pending, never started", p.Status.Phase, p.Status.ContainerStatuses)
	}
}

// Eight pods get the eight IB HCAs, one each; a ninth is found
// unschedulable by the scheduler and runs, on the freed HCA, once one of
// the eight is deleted.
func (w *realWorld) eightThenNine(t *testing.T) {
	var names []string
	for i := range 8 {
		names = append(names, fmt.Sprintf("p%d", i))
		w.realClaimPod(t, names[i], true, tickScript)
	}
	w.waitPhase(t, corev1.PodRunning, names...)
	w.realClaimPod(t, "p8", true, tickScript)
	poll.For(t, "the ninth pod to be found unschedulable", time.Minute, func() (bool, string) {
		p := w.pod(t, "p8")
		if p.Spec.NodeName != "" {
			t.Fatalf("ninth pod placed on %q while eight HCAs are taken", p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				t.Logf("p8: %s: %s", c.Reason, c.Message)
				return true, ""
			}
		}
		return false, fmt.Sprintf("conditions %+v", p.Status.Conditions)
	})
	seen := map[string]string{} // device -> pod
	for _, name := range names {
		_, devs := w.claimOf(t, name)
		if len(devs) != 1 {
			t.Fatalf("%s got %v, want one HCA", name, devs)
		}
		if other, dup := seen[devs[0]]; dup {
			t.Errorf("%s allocated to %s and %s", devs[0], other, name)
		}
		seen[devs[0]] = name
		if got := w.waitTicks(t, name, 0)[0].devs; got != w.uverbsOf(devs[0]) {
			t.Errorf("%s sees %q, want its claim's %s: %q", name, got, devs[0], w.uverbsOf(devs[0]))
		}
	}
	if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, w.ibDevices()) {
		t.Errorf("allocated %v, want the eight IB HCAs %v", got, w.ibDevices())
	}
	_, freed := w.claimOf(t, "p3")
	if err := w.cp.Client.CoreV1().Pods("default").Delete(w.ctx, "p3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitPhase(t, corev1.PodRunning, "p8")
	if got := w.waitTicks(t, "p8", 0)[0].devs; got != w.uverbsOf(freed...) {
		t.Errorf("p8 sees %q, want p3's freed %v: %q", got, freed, w.uverbsOf(freed...))
	}
}

func (w *realWorld) ibDevices() []string {
	var out []string
	for name, h := range w.devices {
		if len(h.Ports) > 0 && h.Ports[0].LinkLayer == hca.LinkLayerInfiniBand {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// A container that exits non-zero is restarted by the kubelet (OnFailure)
// in the same sandbox: the new container gets the claim's HCA again (its
// CDI devices from the kubelet's prepared-claim cache), with no new prepare.
func (w *realWorld) containerRestart(t *testing.T) {
	script := `if [ -e /m/ran ]; then ` + tickScript + `; fi; echo "tick 1: $(ls /dev/infiniband | tr '\n' ' ')"; touch /m/ran; exit 3`
	driver := w.driverPod(t)
	ok0 := w.metric(t, driver, prepareOK)
	w.realClaimPod(t, "crash", true, script, func(p *corev1.Pod) {
		p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		p.Spec.Volumes = []corev1.Volume{{Name: "m", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "m", MountPath: "/m"}}
	})
	var restarts int32
	poll.For(t, "the crashed container to run again", 2*time.Minute, func() (bool, string) {
		p := w.pod(t, "crash")
		if len(p.Status.ContainerStatuses) == 0 {
			return false, "no container status"
		}
		cs := p.Status.ContainerStatuses[0]
		restarts = cs.RestartCount
		return cs.RestartCount >= 1 && cs.State.Running != nil, fmt.Sprintf("%+v", cs)
	})
	uid, devs := w.claimOf(t, "crash")
	want := w.uverbsOf(devs...)
	prev := ticks(w.logs(t, "crash", true))
	cur := w.waitTicks(t, "crash", 1)
	t.Logf("restarts %d; the exited container saw %v, the new one %v", restarts, prev, cur[0])
	if len(prev) != 1 || prev[0].devs != want {
		t.Errorf("the exited container's log: %v, want one tick with %q", prev, want)
	}
	for _, tk := range cur {
		if tk.devs != want {
			t.Errorf("the restarted container sees %q at tick %d, want %q", tk.devs, tk.n, want)
		}
	}
	w.checkPrepared(t, []string{uid})
	// One prepare, when the pod's sandbox was made; the restarted container
	// gets its CDI devices from the kubelet's prepared claim.
	if ok := w.metric(t, driver, prepareOK); ok != ok0+1 {
		t.Errorf("the driver prepared %v claims for the pod and its restarted container, want 1", ok-ok0)
	}
}

// longPods starts n pods running tickScript (restartPolicy Always) and
// returns their names, claim UIDs and what each saw first.
func (w *realWorld) longPods(t *testing.T, prefix string, n int) (names, uids []string, want map[string]string) {
	t.Helper()
	want = map[string]string{}
	for i := range n {
		names = append(names, fmt.Sprintf("%s%d", prefix, i))
		w.realClaimPod(t, names[i], true, tickScript, func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyAlways })
	}
	w.waitPhase(t, corev1.PodRunning, names...)
	for _, name := range names {
		uid, devs := w.claimOf(t, name)
		uids = append(uids, uid)
		want[name] = w.uverbsOf(devs...)
		if got := w.waitTicks(t, name, 0)[0].devs; got != want[name] {
			t.Fatalf("%s sees %q, want %q", name, got, want[name])
		}
	}
	return names, uids, want
}

// containerIDs are the pods' current container IDs.
func (w *realWorld) containerIDs(t *testing.T, names []string) map[string]string {
	t.Helper()
	ids := map[string]string{}
	for _, name := range names {
		p := w.pod(t, name)
		if len(p.Status.ContainerStatuses) == 1 {
			ids[name] = p.Status.ContainerStatuses[0].ContainerID
		}
	}
	return ids
}

// keepSeeing checks that each pod's container is the one it was (ids) and
// that its log, past tick after[name]+2, never listed other devices.
func (w *realWorld) keepSeeing(t *testing.T, names []string, ids map[string]string, after map[string]int, want map[string]string) {
	t.Helper()
	for _, name := range names {
		got := w.waitTicks(t, name, after[name]+2)
		for _, tk := range got {
			if tk.devs != want[name] {
				t.Errorf("%s sees %q at tick %d, want %q", name, tk.devs, tk.n, want[name])
			}
		}
		t.Logf("%s: ticks %d..%d, all %q", name, got[0].n, got[len(got)-1].n, want[name])
	}
	if now := w.containerIDs(t, names); !maps.Equal(now, ids) {
		t.Errorf("containers now %v, were %v: restarted", now, ids)
	}
}

func (w *realWorld) lastTicks(t *testing.T, names []string) map[string]int {
	t.Helper()
	last := map[string]int{}
	for _, name := range names {
		tk := ticks(w.logs(t, name, false))
		last[name] = tk[len(tk)-1].n
	}
	return last
}

// The kubelet restarts while two pods run: their containers stay, still
// seeing their HCAs; the driver's checkpoint and CDI specs are unchanged.
// Kubelet v1.37.2 does not call NodePrepareResources for a running pod
// after its restart (it prepares only when it creates a sandbox,
// kuberuntime_manager.go; its claim cache comes back from its own
// checkpoint with every claim marked unprepared). So the repeat prepare is
// driven here: the first pod's sandbox is killed, the kubelet creates a new
// one and prepares the claim again; the driver answers the repeat
// (idempotent, from its checkpoint) and the new container sees the same HCA.
func (w *realWorld) kubeletRestart(t *testing.T) {
	names, uids, want := w.longPods(t, "kr", 2)
	driver := w.driverPod(t)
	ok0, err0 := w.metric(t, driver, prepareOK), w.metric(t, driver, prepareErr)
	ids := w.containerIDs(t, names)
	after := w.lastTicks(t, names)
	w.checkPrepared(t, uids)

	w.n.StopKubelet()
	if err := w.n.StartKubelet(w.ctx); err != nil {
		t.Fatal(err)
	}
	w.keepSeeing(t, names, ids, after, want)
	w.checkPrepared(t, uids)
	ok1, err1 := w.metric(t, driver, prepareOK), w.metric(t, driver, prepareErr)
	t.Logf("driver prepares across the kubelet restart: success %v -> %v, error %v -> %v", ok0, ok1, err0, err1)
	if err1 != err0 {
		t.Errorf("failed prepares after the kubelet restart: %v -> %v\n%s", err0, err1, w.driverLog(false))
	}
	if d := w.driverPod(t); d.UID != driver.UID || d.Status.ContainerStatuses[0].RestartCount != driver.Status.ContainerStatuses[0].RestartCount {
		t.Errorf("driver pod %s restarts %d, was %s restarts %d", d.UID, d.Status.ContainerStatuses[0].RestartCount, driver.UID, driver.Status.ContainerStatuses[0].RestartCount)
	}

	// A new sandbox after the restart: the kubelet prepares kr0's claim again.
	sandbox := w.sandboxOf(t, ids["kr0"])
	sigkill(t, w.taskPid(t, sandbox))
	poll.For(t, "kr0 to run in a new sandbox", 2*time.Minute, func() (bool, string) {
		p := w.pod(t, "kr0")
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].ContainerID != ids["kr0"] && cs[0].State.Running != nil, fmt.Sprintf("%+v", cs)
	})
	poll.For(t, "the driver to answer the kubelet's repeat NodePrepareResources", time.Minute, func() (bool, string) {
		ok := w.metric(t, driver, prepareOK)
		return ok >= ok1+1, fmt.Sprintf("success %v (was %v), error %v", ok, ok1, w.metric(t, driver, prepareErr))
	})
	if e := w.metric(t, driver, prepareErr); e != err0 {
		t.Errorf("failed prepares: %v, were %v", e, err0)
	}
	for _, tk := range w.waitTicks(t, "kr0", 1) {
		if tk.devs != want["kr0"] {
			t.Errorf("kr0's new container sees %q at tick %d, want %q", tk.devs, tk.n, want["kr0"])
		}
	}
	w.checkPrepared(t, uids)
	t.Logf("the repeat prepare after the new sandbox: success %v -> %v", ok1, w.metric(t, driver, prepareOK))
}

// sandboxOf is the pod sandbox of a container (containerd's annotation).
func (w *realWorld) sandboxOf(t *testing.T, containerID string) string {
	t.Helper()
	out, err := w.n.Ctr(w.ctx, "containers", "info", strings.TrimPrefix(containerID, "containerd://"))
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Spec struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"Spec"`
	}
	if i := strings.IndexByte(out, '{'); i > 0 {
		out = out[i:] // after ctr's warnings
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("ctr containers info: %v\n%s", err, out)
	}
	id := info.Spec.Annotations["io.kubernetes.cri.sandbox-id"]
	if id == "" {
		t.Fatalf("no sandbox id in the annotations %v", info.Spec.Annotations)
	}
	return id
}

// containerd restarts while a pod runs: its container (in its shim) stays,
// still seeing its HCA; nothing is re-prepared or leaked.
func (w *realWorld) containerdRestart(t *testing.T) {
	names, uids, want := w.longPods(t, "cr", 2)
	driver := w.driverPod(t)
	ok0, err0 := w.metric(t, driver, prepareOK), w.metric(t, driver, prepareErr)
	ids := w.containerIDs(t, names)
	after := w.lastTicks(t, names)

	w.n.StopContainerd()
	if err := w.n.StartContainerd(w.ctx); err != nil {
		t.Fatal(err)
	}
	w.keepSeeing(t, names, ids, after, want)
	w.checkPrepared(t, uids)
	ok1, err1 := w.metric(t, driver, prepareOK), w.metric(t, driver, prepareErr)
	t.Logf("driver prepares across the containerd restart: success %v -> %v, error %v -> %v", ok0, ok1, err0, err1)
	if err1 != err0 {
		t.Errorf("failed prepares after the containerd restart: %v -> %v", err0, err1)
	}
	if d := w.driverPod(t); d.UID != driver.UID || d.Status.ContainerStatuses[0].RestartCount != driver.Status.ContainerStatuses[0].RestartCount {
		t.Errorf("driver pod restarted across the containerd restart")
	}
	// New work after the restart.
	w.realClaimPod(t, "cr-after", true, "ls /dev/infiniband")
	w.waitPhase(t, corev1.PodSucceeded, "cr-after")
	devs := w.doneDevices(t, "cr-after")
	if got := strings.Join(infinibandListing(w.logs(t, "cr-after", false)), " "); got != w.uverbsOf(devs...) {
		t.Errorf("cr-after sees %q, want %q", got, w.uverbsOf(devs...))
	}
}

// The driver's container is SIGKILLed while four pods run; the kubelet
// restarts it. The running pods keep their HCAs, the checkpoint still holds
// their claims, four more pods get the four other HCAs (no HCA twice), and
// everything is unprepared in the end (reset).
func (w *realWorld) driverSIGKILL(t *testing.T) {
	names, uids, want := w.longPods(t, "k", 4)
	ids := w.containerIDs(t, names)
	after := w.lastTicks(t, names)
	driver := w.driverPod(t)
	restarts := driver.Status.ContainerStatuses[0].RestartCount
	pid := w.taskPid(t, driver.Status.ContainerStatuses[0].ContainerID)
	sigkill(t, pid)
	t.Logf("SIGKILLed the driver (pid %d on the node)", pid)
	poll.For(t, "the kubelet to restart the driver", 2*time.Minute, func() (bool, string) {
		p := w.driverPod(t)
		cs := p.Status.ContainerStatuses
		return p.UID == driver.UID && len(cs) == 1 && cs[0].RestartCount > restarts && ready(&p), fmt.Sprintf("%+v", cs)
	})
	w.checkPrepared(t, uids)
	w.keepSeeing(t, names, ids, after, want)

	var more []string
	for i := 4; i < 8; i++ {
		more = append(more, fmt.Sprintf("k%d", i))
		w.realClaimPod(t, more[i-4], true, tickScript)
	}
	w.waitPhase(t, corev1.PodRunning, more...)
	seen := map[string]string{}
	for _, name := range append(slices.Clone(names), more...) {
		got := w.waitTicks(t, name, 0)[0].devs
		if other, dup := seen[got]; dup {
			t.Errorf("%q seen by %s and %s while both run", got, other, name)
		}
		seen[got] = name
		if len(strings.Fields(got)) != 2 {
			t.Errorf("%s sees %q, want rdma_cm and one uverbs", name, got)
		}
	}
	var all []string
	for _, name := range more {
		uid, _ := w.claimOf(t, name)
		all = append(all, uid)
	}
	w.checkPrepared(t, append(all, uids...))
}

// A rolling update of the DaemonSet (a changed pod template, the chart's
// maxSurge 1): the new daemon starts beside the old one, the old one goes.
// Pods prepared by the old daemon keep their HCAs; the new daemon prepares
// new claims and unprepares the old daemon's (one checkpoint).
func (w *realWorld) rollingUpdate(t *testing.T) {
	names, uids, want := w.longPods(t, "r", 2)
	ids := w.containerIDs(t, names)
	after := w.lastTicks(t, names)
	old := w.driverPod(t)
	// The old pod's deletion (by the DaemonSet controller), from a watch:
	// the pod may be gone between two polls.
	wch, err := w.cp.Client.CoreV1().Pods("rdma-system").Watch(w.ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + old.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer wch.Stop()
	deleted := make(chan metav1.Time, 1)
	go func() {
		for ev := range wch.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && p.DeletionTimestamp != nil {
				// DeletionTimestamp is the deletion's time plus the grace period.
				at := p.DeletionTimestamp.Time
				if g := p.DeletionGracePeriodSeconds; g != nil {
					at = at.Add(-time.Duration(*g) * time.Second)
				}
				deleted <- metav1.NewTime(at)
				return
			}
		}
	}()
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e.rdma.dra.dev/rollout":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := w.cp.Client.AppsV1().DaemonSets("rdma-system").Patch(w.ctx, w.release+"-node", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.For(t, "the new driver pod Ready and the old one gone", 3*time.Minute, func() (bool, string) {
		l, err := w.cp.Client.CoreV1().Pods("rdma-system").List(w.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + w.release})
		if err != nil {
			return false, err.Error()
		}
		var st []string
		readyNew, oldLeft := false, false
		for _, p := range l.Items {
			if p.UID == old.UID {
				oldLeft = true
			} else if ready(&p) {
				readyNew = true
			}
			st = append(st, fmt.Sprintf("%s %s ready %v", p.Name, p.Status.Phase, ready(&p)))
		}
		return readyNew && !oldLeft, strings.Join(st, "; ")
	})
	driver := w.driverPod(t)
	var readyAt metav1.Time
	for _, c := range driver.Status.Conditions {
		if c.Type == corev1.PodReady {
			readyAt = c.LastTransitionTime
		}
	}
	select {
	case del := <-deleted:
		t.Logf("rolling update: new pod %s Ready at %s, old pod %s deleted at %s", driver.Name, readyAt.UTC().Format(time.TimeOnly), old.Name, del.UTC().Format(time.TimeOnly))
		if del.Before(&readyAt) {
			t.Errorf("the old driver pod was deleted before the new one was Ready (maxSurge 1, maxUnavailable 0)")
		}
	case <-time.After(30 * time.Second):
		t.Errorf("no deletion of the old driver pod %s seen", old.Name)
	}
	w.keepSeeing(t, names, ids, after, want)
	w.checkPrepared(t, uids)

	w.realClaimPod(t, "r-new", true, tickScript)
	w.waitPhase(t, corev1.PodRunning, "r-new")
	newUID, devs := w.claimOf(t, "r-new")
	if got := w.waitTicks(t, "r-new", 0)[0].devs; got != w.uverbsOf(devs...) || got == want["r0"] || got == want["r1"] {
		t.Errorf("r-new sees %q, want its own %q (r0 %q, r1 %q)", got, w.uverbsOf(devs...), want["r0"], want["r1"])
	}
	if ok := w.metric(t, driver, prepareOK); ok != 1 {
		t.Errorf("the new daemon prepared %v claims, want r-new's 1", ok)
	}
	// r0 was prepared by the old daemon; the new one unprepares it.
	if err := w.cp.Client.CoreV1().Pods("default").Delete(w.ctx, "r0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.For(t, "r0's claim unprepared by the new daemon", time.Minute, func() (bool, string) {
		_, held := w.checkpoint(t).Claims[uids[0]]
		return !held && w.metric(t, driver, unprepareOK) >= 1, fmt.Sprintf("in the checkpoint %v, unprepared %v", held, w.metric(t, driver, unprepareOK))
	})
	w.checkPrepared(t, []string{uids[1], newUID})
}

// Seven of the eight IB ports go DOWN (the simulator's sysfs): the driver
// taints those devices, a new claim lands on the one healthy IB HCA, and the
// running pod's allocatedResourcesStatus, filled by the real kubelet from
// the driver's health stream, goes Healthy -> Unhealthy naming the port.
func (w *realWorld) portDown(t *testing.T) {
	w.realClaimPod(t, "victim", true, tickScript)
	w.waitPhase(t, corev1.PodRunning, "victim")
	_, vdevs := w.claimOf(t, "victim")
	victim := vdevs[0]
	var keep string
	var down []string
	for _, d := range w.ibDevices() {
		if keep == "" && d != victim {
			keep = d
		} else {
			down = append(down, d)
		}
	}
	poll.For(t, "the victim's status to show its HCA Healthy", time.Minute, func() (bool, string) {
		h, msg := w.podHealth(t, "victim")
		return h == corev1.ResourceHealthStatusHealthy, fmt.Sprintf("%s %q; status %+v", h, msg, w.pod(t, "victim").Status.ContainerStatuses)
	})
	t.Cleanup(func() {
		for _, d := range down {
			_ = w.sim.SetPortState(w.devices[d].Name, 1, "4: ACTIVE", "5: LinkUp")
		}
	})
	for _, d := range down {
		if err := w.sim.SetPortState(w.devices[d].Name, 1, "1: DOWN", "2: Polling"); err != nil {
			t.Fatal(err)
		}
	}
	poll.For(t, "seven tainted devices", time.Minute, func() (bool, string) {
		var tainted []string
		l, err := w.cp.Client.ResourceV1().ResourceSlices().List(w.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, s := range l.Items {
			for _, d := range s.Spec.Devices {
				if len(d.Taints) > 0 && d.Taints[0].Key == "rdma.dra.dev/port-down" {
					tainted = append(tainted, d.Name)
				}
			}
		}
		slices.Sort(tainted)
		return slices.Equal(tainted, down), fmt.Sprintf("tainted %v, want %v", tainted, down)
	})
	wantMsg := w.devices[victim].Name + ": port 1 is DOWN (Polling)"
	poll.For(t, "the victim's status to show its HCA Unhealthy", time.Minute, func() (bool, string) {
		h, msg := w.podHealth(t, "victim")
		return h == corev1.ResourceHealthStatusUnhealthy && msg == wantMsg, fmt.Sprintf("%s %q, want Unhealthy %q", h, msg, wantMsg)
	})
	t.Logf("victim's allocatedResourcesStatus: %+v", w.pod(t, "victim").Status.ContainerStatuses[0].AllocatedResourcesStatus)
	w.realClaimPod(t, "healthy", true, "ls /dev/infiniband")
	w.waitPhase(t, corev1.PodSucceeded, "healthy")
	if got := strings.Join(infinibandListing(w.logs(t, "healthy", false)), " "); got != w.uverbsOf(keep) {
		t.Errorf("the new pod sees %q, want the one healthy IB HCA %s: %q", got, keep, w.uverbsOf(keep))
	}
	// The victim keeps its HCA.
	for _, tk := range w.waitTicks(t, "victim", 1) {
		if tk.devs != w.uverbsOf(victim) {
			t.Errorf("victim sees %q at tick %d, want %q", tk.devs, tk.n, w.uverbsOf(victim))
		}
	}
}

// podHealth is the health and message of the devices of the pod's claim
// "rdma" in its container's allocatedResourcesStatus (the kubelet's).
func (w *realWorld) podHealth(t *testing.T, name string) (corev1.ResourceHealthStatus, string) {
	p := w.pod(t, name)
	if len(p.Status.ContainerStatuses) == 0 {
		return "", "no container status"
	}
	for _, rs := range p.Status.ContainerStatuses[0].AllocatedResourcesStatus {
		if rs.Name != "claim:rdma" || len(rs.Resources) == 0 {
			continue
		}
		msg := ""
		if m := rs.Resources[0].Message; m != nil {
			msg = *m
		}
		return rs.Resources[0].Health, msg
	}
	return "", fmt.Sprintf("no claim:rdma entry in %+v", p.Status.ContainerStatuses[0].AllocatedResourcesStatus)
}
