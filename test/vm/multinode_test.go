package vm

// TestMultiNode: two guests, two real nodes (rdma-vm-a, rdma-vm-b) of one
// in-process control plane, joined by a private Ethernet segment that only
// the two guests share (QEMU's socket netdev, UDP on the host's loopback),
// 10.0.9.1/24 and 10.0.9.2/24 with an rxe on each end. The chart, installed
// once, runs a driver on each node; an Indexed Job of two ranks on distinct
// nodes, each with a claim from a ResourceClaimTemplate whose DeviceClass
// picks the link's rxe by its attributes, runs perftest, rping and UCX
// between the nodes, configured only by what the driver put into the
// containers. Then node B's link goes down under a long transfer.
//
// docs/vm.md has the picture; `make test-multinode` runs it and prints the
// `cross-node:` summary lines.

import (
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/node"
	"github.com/rdma-dra/rdma-dra-driver/test/vm/nodeguest"
)

const (
	nodeA            = "rdma-vm-a"
	nodeB            = "rdma-vm-b"
	linkRxe          = "rxe2" // rxe0 and rxe1 are the image's, on eth0 and eth1
	multiNodeTimeout = 30 * time.Minute
	linkClass        = "vm-link." + driverName
	linkTemplate     = "vm-link"
	// The transfers' sizes: MBs, since TCG moves tens to hundreds of Mbit/s.
	bwSize, bwIters     = 65536, 200
	latSize, latIters   = 64, 1000
	rpingSize, rpingCnt = 4096, 500
	ucxSize, ucxIters   = 65536, 200
)

// linkNodes are the two guests' ends of the link, and their pod subnets:
// each guest routes the other's over the link (host-gw style).
var linkNodes = []struct{ name, addr, mac, podCIDR string }{
	{nodeA, "10.0.9.1", "52:54:00:00:09:01", "10.88.1.0/24"},
	{nodeB, "10.0.9.2", "52:54:00:00:09:02", "10.88.2.0/24"},
}

// linkRoutes are the routes of node's guest to the other nodes' pods.
func linkRoutes(node string) []nodeguest.Route {
	var out []nodeguest.Route
	for _, n := range linkNodes {
		if n.name != node {
			out = append(out, nodeguest.Route{CIDR: n.podCIDR, Via: n.addr})
		}
	}
	return out
}

func TestMultiNode(t *testing.T) {
	v := newVMCluster(t)
	files := v.nodeFiles()
	for _, n := range linkNodes {
		files = append(files, v.nodeConfig(guestConfigOf(n.name), nodeguest.Config{Node: n.name, SharedNetwork: true, PodCIDR: n.podCIDR,
			Link: &nodeguest.Link{MAC: n.mac, Address: n.addr + "/24", Rxe: linkRxe, Routes: linkRoutes(n.name)}}))
	}
	// One image: each boot names its node's config on the kernel command
	// line, which the kernel hands to /init's environment.
	im := v.image(files, nil, multiNodeTimeout)
	ports := freeUDPPorts(t, 2)
	for i, n := range linkNodes {
		v.boot(&Boot{Image: im, MemMB: 4096,
			Link:   &LinkNIC{MAC: n.mac, Local: ports[i], Remote: ports[1-i]},
			Append: []string{nodeguest.ConfigEnv + "=" + guestConfigOf(n.name)}}, n.name)
	}
	defer v.finish()
	// The chart while the guests boot, so its DaemonSet has no pod yet when
	// the probes are patched. The periodic rescan an hour away: a port
	// going down must be seen by the driver's fast path (port poll, kernel
	// events). RDMA for pods on their own network on, and the hook's
	// memlock unlimited (the chart's default, said here): the restricted
	// Job's ranks have neither hostNetwork nor IPC_LOCK.
	installed := time.Now()
	if _, err := cluster.InstallChart(v.ctx, v.cp, v.dir, "rdma", "rdma-system", `{"image":{"tag":"dev"},"rescanInterval":"1h","allowNonHostNetwork":true,"memlock":"unlimited"}`); err != nil {
		t.Fatal(err)
	}
	m := &multiNode{vmCluster: v, facts: map[string]map[string]string{}}
	m.slowProbes()
	for _, n := range linkNodes {
		v.waitNodeReady(n.name)
	}
	v.waitDrivers(len(linkNodes), installed)
	m.checkSlices()
	m.createClass()
	m.transfers()
	m.restrictedTransfers()
	for _, n := range linkNodes {
		t.Logf("%s's driver after the transfers: %s", n.name, m.driverContainer(n.name))
	}
	m.portDown()
	m.nothingLeft()
	for _, n := range linkNodes {
		t.Logf("%s's driver at the end: %s", n.name, m.driverContainer(n.name))
	}
}

// slowProbes gives the driver's probes 10 s to answer, and the liveness
// probe a minute of failures: two TCG guests on a shared 2-core host
// answered in more than the default second, and the kubelet restarted
// the drivers mid-test (a restart would hide whether the port-down taint
// came from the fast path).
func (m *multiNode) slowProbes() {
	ds := m.cp.Client.AppsV1().DaemonSets("rdma-system")
	list, err := ds.List(m.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=rdma"})
	if err != nil || len(list.Items) != 1 {
		m.t.Fatalf("the chart's DaemonSet: %v (%d found)", err, len(list.Items))
	}
	d := &list.Items[0]
	for i := range d.Spec.Template.Spec.Containers {
		c := &d.Spec.Template.Spec.Containers[i]
		for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
			if p != nil {
				p.TimeoutSeconds = 10
			}
		}
		if c.LivenessProbe != nil {
			c.LivenessProbe.FailureThreshold = 6
		}
	}
	if _, err := ds.Update(m.ctx, d, metav1.UpdateOptions{}); err != nil {
		m.t.Fatal(err)
	}
}

// guestConfigOf is the node's config in the image (no dot in the path:
// the kernel takes a parameter with one in its name for a module's).
func guestConfigOf(node string) string { return "/etc/" + node + "-config" }

// freeUDPPorts are n free UDP ports on the host's loopback.
func freeUDPPorts(t *testing.T, n int) []string {
	var out []string
	var conns []net.PacketConn
	for i := 0; i < n; i++ {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		out = append(out, c.LocalAddr().String())
	}
	for _, c := range conns {
		c.Close()
	}
	return out
}

type multiNode struct {
	*vmCluster
	facts map[string]map[string]string // by node: what its kernel says about the link's rxe
}

// movedAttributes left the slice for the metadata file
// (docs/attributes.md): a slice with one of them is the old contract.
var movedAttributes = []string{"ibdev", "nodeGUID", "sysImageGUID", "portState", "physState", "ports", "roceGIDIndex", "netnsMode", "lid", "hcaType", "vendorID", "deviceID", "uverbs"}

// checkSlices compares each node's slice entry for the link's rxe,
// attribute by attribute, with what the guest's kernel said, and checks
// that the slice holds nothing else (the rest is the metadata file's,
// checked in checkContainer).
func (m *multiNode) checkSlices() {
	t := m.t
	for _, n := range linkNodes {
		m.wait(n.name+"'s kernel facts", 2*time.Minute, func() (bool, string) {
			cm, err := m.cp.Client.CoreV1().ConfigMaps("default").Get(m.ctx, nodeguest.KernelFacts(n.name), metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			m.facts[n.name] = cm.Data
			return true, ""
		})
		f := m.facts[n.name]
		rate, _ := strconv.ParseFloat(strings.Fields(f["rate"] + " x")[0], 64)
		// model: the link's device is an rxe by construction (rdma link add
		// type rxe), which the driver names Soft-RoCE.
		want := map[string]string{
			"legacy": "false", "transport": "roce", "linkLayer": f["linkLayer"], "model": "Soft-RoCE",
			"rateGbps": strconv.Itoa(int(math.Floor(rate))), "netdev": f["netdev"], "sriovVF": "false", "software": "true",
		}
		if f["fwVer"] != "" {
			t.Errorf("%s's %s has fw_ver %q: rxe's is empty on 6.1, the test knows no firmwareVersion for it", n.name, linkRxe, f["fwVer"])
		}
		var d *resourceapi.Device
		m.wait(n.name+"'s slice with "+linkRxe, 2*time.Minute, func() (bool, string) {
			var err error
			if d, err = m.sliceDevice(n.name, linkRxe); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
		got := attributeStrings(d)
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s's slice: %s/%s is %q, its kernel says %q", n.name, linkRxe, k, got[k], w)
			}
		}
		for k, v := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("%s's slice: %s has %s=%q, which is not a slice attribute of an rxe (docs/attributes.md)", n.name, linkRxe, k, v)
			}
		}
		for _, k := range movedAttributes {
			if _, ok := got[k]; ok {
				t.Errorf("%s's slice: %s still has %s, which moved to the metadata file", n.name, linkRxe, k)
			}
		}
		// An ACTIVE port: no port-down taint.
		if f["portState"] != "ACTIVE" || len(d.Taints) > 0 {
			t.Errorf("%s's %s: kernel port %s, slice taints %+v; want ACTIVE and none", n.name, linkRxe, f["portState"], d.Taints)
		}
		t.Logf("%s's slice matches its kernel for %s: %v, no taint", n.name, linkRxe, got)
	}
	if a, b := m.facts[nodeA]["netdev"], m.facts[nodeB]["netdev"]; a != b {
		t.Fatalf("the link's netdev is %s on %s but %s on %s: one DeviceClass cannot select both", a, nodeA, b, nodeB)
	}
}

// sliceDevice is the device of the node's slices named dev.
func (m *multiNode) sliceDevice(nodeName, dev string) (*resourceapi.Device, error) {
	slices, err := m.cp.Client.ResourceV1().ResourceSlices().List(m.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var seen []string
	for _, s := range slices.Items {
		if s.Spec.Driver != driverName || s.Spec.NodeName == nil || *s.Spec.NodeName != nodeName {
			continue
		}
		for i, d := range s.Spec.Devices {
			if d.Name == dev {
				return &s.Spec.Devices[i], nil
			}
			seen = append(seen, d.Name)
		}
	}
	return nil, fmt.Errorf("no %s in %s's slices (devices %v)", dev, nodeName, seen)
}

// attributeStrings are a device's attributes in the driver's domain as
// strings.
func attributeStrings(d *resourceapi.Device) map[string]string {
	out := map[string]string{}
	for k, a := range d.Attributes {
		name, ok := strings.CutPrefix(string(k), driverName+"/")
		if !ok {
			continue
		}
		switch {
		case a.StringValue != nil:
			out[name] = *a.StringValue
		case a.IntValue != nil:
			out[name] = strconv.FormatInt(*a.IntValue, 10)
		case a.BoolValue != nil:
			out[name] = strconv.FormatBool(*a.BoolValue)
		case a.VersionValue != nil:
			out[name] = *a.VersionValue
		}
	}
	return out
}

// createClass makes the DeviceClass that picks the link's rxe by its
// attributes, and the ResourceClaimTemplate of the Jobs in default. No port state:
// the port-down taint keeps a down port from being allocated.
func (m *multiNode) createClass() {
	netdev := m.facts[nodeA]["netdev"]
	attr := fmt.Sprintf("device.attributes[%q]", driverName)
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: linkClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.driver == %q && %s.legacy == false && %s.transport == "roce" && %s.netdev == %q`,
				driverName, attr, attr, attr, netdev)}}}}}
	if _, err := m.cp.Client.ResourceV1().DeviceClasses().Create(m.ctx, class, metav1.CreateOptions{}); err != nil {
		m.t.Fatal(err)
	}
	m.createTemplate("default")
}

// createTemplate creates the Jobs' ResourceClaimTemplate in namespace ns.
func (m *multiNode) createTemplate(ns string) {
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: linkTemplate},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "hca", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: linkClass}}}}}}}
	if _, err := m.cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(m.ctx, tmpl, metav1.CreateOptions{}); err != nil {
		m.t.Fatal(err)
	}
}

// metadataPath is the metadata file of the Job's claim (pod claim "rdma",
// request "hca") in the container, metadataKeys the fields the ranks
// report from it.
var (
	metadataPath = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/rdma/hca/" + driverName + "-metadata.json"
	metadataKeys = []string{"ibdev", "nodeGUID", "sysImageGUID", "portState", "physState", "ports", "roceGIDIndex", "netnsMode",
		"netdev", "uverbs", "port1State", "port1RoceGidIndex"}
)

// transferTools are the tools of rank.sh's transfers, in its order.
var transferTools = []string{"ib_write_bw", "ib_read_lat", "rping", "ucx_perftest"}

// transferBytes is what each tool's client moved, by the numbers of its
// result line: perftest's "#bytes #iterations", ucx_perftest's iterations,
// rping's count (one RDMA read and one write of the buffer per ping).
func transferBytes(tool, result string) (int64, error) {
	f := strings.Fields(result)
	num := func(i int) (int64, error) {
		if i >= len(f) {
			return 0, fmt.Errorf("%s: no field %d in %q", tool, i, result)
		}
		return strconv.ParseInt(f[i], 10, 64)
	}
	switch tool {
	case "ib_write_bw", "ib_read_lat":
		size, err := num(0)
		if err != nil {
			return 0, err
		}
		iters, err := num(1)
		return size * iters, err
	case "ucx_perftest": // Final: <iterations> ...
		iters, err := num(1)
		return ucxSize * iters, err
	case "rping":
		return 2 * rpingSize * rpingCnt, nil
	}
	return 0, fmt.Errorf("unknown tool %s", tool)
}

// rankJob is an Indexed Job of two ranks on distinct nodes, each with a
// claim from the link's template in its namespace, running a script of
// rankScripts.
type rankJob struct {
	name, ns string
	command  []string
	env      []corev1.EnvVar
	// podNetwork: restricted ranks on the pods' network (non-root, every
	// capability dropped, RuntimeDefault seccomp, no /dev/shm volume);
	// else hostNetwork ranks with IPC_LOCK and a memory /dev/shm.
	podNetwork bool
}

// podSpec is the ranks' pod spec; labels select the Job's pods.
func (j rankJob) podSpec(labels map[string]string) corev1.PodSpec {
	ctr := corev1.Container{Name: "rank", Image: ToolsImageName, ImagePullPolicy: corev1.PullNever, Command: j.command,
		Env: append(j.env, corev1.EnvVar{Name: "PEER", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: j.name + "-rank0"}, Key: "address"}}}),
		Resources:    corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "rdma"}}},
		VolumeMounts: []corev1.VolumeMount{{Name: "scripts", MountPath: guestScripts, ReadOnly: true}}}
	spec := corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		// A rank still running when its Job is deleted (portDown's A) is
		// killed at once: sh as PID 1 ignores SIGTERM.
		TerminationGracePeriodSeconds: ptrTo(int64(1)),
		Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: "kubernetes.io/hostname"}}}},
		ResourceClaims: []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimTemplateName: ptrTo(linkTemplate)}},
		Volumes: []corev1.Volume{{Name: "scripts", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: rankScripts}}}}},
	}
	if j.podNetwork {
		spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptrTo(true), RunAsUser: ptrTo(int64(restrictedUID)),
			RunAsGroup: ptrTo(int64(restrictedUID)), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
		ctr.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptrTo(false),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	} else {
		spec.HostNetwork = true
		ctr.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"IPC_LOCK"}}}
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: "shm", MountPath: "/dev/shm"})
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "shm", VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}})
	}
	spec.Containers = []corev1.Container{ctr}
	return spec
}

// job creates j; rank 0's address (its node's link address, or its pod's
// once it has one) reaches the ranks as PEER from a ConfigMap the test
// writes once the scheduler has placed the pods (the kubelet holds the
// containers until it exists). It returns the pods by completion index.
func (m *multiNode) job(j rankJob) map[string]*corev1.Pod {
	t := m.t
	two, zero := int32(2), int32(0)
	activeDeadline := int64(multiNodeTimeout.Seconds() / 3)
	mode := batchv1.IndexedCompletion
	labels := map[string]string{"rdma-vm-job": j.name}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: j.name},
		Spec: batchv1.JobSpec{CompletionMode: &mode, Completions: &two, Parallelism: &two, BackoffLimit: &zero,
			ActiveDeadlineSeconds: &activeDeadline,
			Template:              corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: j.podSpec(labels)}}}
	m.createRankScripts(j.ns)
	if _, err := m.cp.Client.BatchV1().Jobs(j.ns).Create(m.ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	addr := ""
	m.wait("job "+j.name+"'s two pods scheduled, rank 0 addressed", 5*time.Minute, func() (bool, string) {
		list, err := m.cp.Client.CoreV1().Pods(j.ns).List(m.ctx, metav1.ListOptions{LabelSelector: "rdma-vm-job=" + j.name})
		if err != nil {
			return false, err.Error()
		}
		var why []string
		for i := range list.Items {
			p := &list.Items[i]
			if p.Spec.NodeName != "" {
				pods[p.Labels[batchv1.JobCompletionIndexAnnotation]] = p
			}
			why = append(why, fmt.Sprintf("%s on %q (IP %q): %+v", p.Name, p.Spec.NodeName, p.Status.PodIP, p.Status.Conditions))
		}
		if r0 := pods["0"]; r0 != nil && j.podNetwork {
			addr = r0.Status.PodIP
		} else if r0 != nil {
			for _, n := range linkNodes {
				if n.name == r0.Spec.NodeName {
					addr = n.addr
				}
			}
		}
		return len(pods) == 2 && addr != "", strings.Join(why, "; ")
	})
	if pods["0"] == nil || pods["1"] == nil {
		t.Fatalf("job %s: pods by index %v, want 0 and 1", j.name, pods)
	}
	if pods["0"].Spec.NodeName == pods["1"].Spec.NodeName {
		t.Fatalf("job %s: both ranks on %s", j.name, pods["0"].Spec.NodeName)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: j.name + "-rank0"}, Data: map[string]string{"address": addr}}
	if _, err := m.cp.Client.CoreV1().ConfigMaps(j.ns).Create(m.ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("job %s/%s: rank 0 on %s (%s), rank 1 on %s", j.ns, j.name, pods["0"].Spec.NodeName, addr, pods["1"].Spec.NodeName)
	return pods
}

// transfers runs the four clients between the nodes and prints one
// cross-node: line per transfer.
func (m *multiNode) transfers() {
	t := m.t
	started := time.Now()
	pods := m.job(rankJob{name: "cross", ns: "default", command: []string{"sh", guestScripts + "/rank.sh", "transfers"}, env: rankEnv()})
	msgs := m.terminationMessages(pods["0"].Name, pods["1"].Name)
	t.Logf("the job's ranks ended %s after its creation", time.Since(started).Round(100*time.Millisecond))
	ibdev := map[string]string{} // by node, as its rank's metadata file named it
	for _, p := range pods {
		out := msgs[p.Name]
		t.Logf("%s (rank %s on %s) said:\n%s", p.Name, p.Labels[batchv1.JobCompletionIndexAnnotation], p.Spec.NodeName, out)
		ibdev[p.Spec.NodeName] = m.checkContainer(p.Spec.NodeName, p.Name, out)
	}
	client := msgs[pods["1"].Name]
	var lines []string
	for _, tool := range transferTools {
		status := regexp.MustCompile(`(?m)^` + tool + ` exit=(\d+) secs=([\d.]+) pkts=(.*)$`).FindStringSubmatch(client)
		if status == nil || status[1] != "0" {
			t.Errorf("%s: the client failed or said nothing: %v", tool, status)
			continue
		}
		if srv := regexp.MustCompile(`(?m)^` + tool + ` exit=0 `).FindString(msgs[pods["0"].Name]); srv == "" {
			t.Errorf("%s: the server (rank 0) did not exit 0", tool)
		}
		result := ""
		if tool != "rping" {
			r := regexp.MustCompile(`(?m)^` + tool + `\| (.*)$`).FindStringSubmatch(client)
			if r == nil {
				t.Errorf("%s: no result line in the client's output", tool)
				continue
			}
			result = r[1]
		}
		n, err := transferBytes(tool, result)
		if err != nil || n <= 0 {
			t.Errorf("%s: bytes moved %d (%v) from %q", tool, n, err, result)
			continue
		}
		// The link's rxe itself carried the transfer: its packet counters
		// ("sent rcvd -> sent rcvd") moved.
		if c := regexp.MustCompile(`^(\d+) (\d+) -> (\d+) (\d+)`).FindStringSubmatch(status[3]); c == nil {
			t.Errorf("%s: no packet counters of %s: %q", tool, linkRxe, status[3])
		} else if c[1] == c[3] {
			t.Errorf("%s: %s's sent_pkts did not move (%s -> %s)", tool, linkRxe, c[1], c[3])
		}
		lines = append(lines, fmt.Sprintf("cross-node: %s %d bytes %s/%s <-> %s/%s in %ss", tool, n, nodeA, ibdev[nodeA], nodeB, ibdev[nodeB], status[2]))
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	m.deleteJob("default", "cross")
}

// checkContainer holds what the driver put into a rank's container: only
// its claim's uverbs node and rdma_cm, the hints the tools used, and a
// metadata file whose fields (those the slice no longer has among them)
// match the guest's kernel. It returns the metadata's ibdev.
func (m *multiNode) checkContainer(nodeName, pod, out string) string {
	t := m.t
	f := m.facts[nodeName]
	for _, w := range []string{
		"dev=" + linkRxe + " ", "gid=" + f["roceGIDIndex"] + " ", "ucxgid=" + f["roceGIDIndex"] + " ",
		"ucxdev=" + linkRxe + ":1 ", "uverbs=/dev/infiniband/" + f["uverbs"] + " ",
		"devices: rdma_cm " + f["uverbs"] + " \n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("%s on %s: no %q in what its container said", pod, nodeName, strings.TrimSpace(w))
		}
	}
	md := map[string]string{}
	line := regexp.MustCompile(`(?m)^md: (.*)$`).FindStringSubmatch(out)
	if line == nil {
		t.Errorf("%s on %s: no metadata line in what its container said", pod, nodeName)
		return ""
	}
	for _, kv := range strings.Fields(line[1]) {
		k, v, _ := strings.Cut(kv, "=")
		md[k] = v
	}
	want := map[string]string{
		"ibdev": f["ibdev"], "nodeGUID": f["nodeGUID"], "sysImageGUID": f["sysImageGUID"],
		"portState": f["portState"], "physState": f["physState"], "ports": f["ports"],
		"roceGIDIndex": f["roceGIDIndex"], "port1RoceGidIndex": f["roceGIDIndex"], "port1State": f["portState"],
		"netnsMode": "shared", "netdev": f["netdev"], "uverbs": "/dev/infiniband/" + f["uverbs"],
	}
	for _, k := range metadataKeys {
		if md[k] != want[k] {
			t.Errorf("%s on %s: the metadata file's %s is %q, its kernel says %q", pod, nodeName, k, md[k], want[k])
		}
	}
	return md["ibdev"]
}

// deleteJob deletes the Job with its pods and waits for them to go.
func (m *multiNode) deleteJob(ns, name string) {
	bg := metav1.DeletePropagationBackground
	if err := m.cp.Client.BatchV1().Jobs(ns).Delete(m.ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		m.t.Fatal(err)
	}
	m.wait("job "+name+"'s pods gone", 3*time.Minute, func() (bool, string) {
		list, err := m.cp.Client.CoreV1().Pods(ns).List(m.ctx, metav1.ListOptions{LabelSelector: "rdma-vm-job=" + name})
		if err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d pods", len(list.Items))
	})
}

// portDown: a long ib_write_bw between the nodes (the ranks exit 0
// whatever it does, so the Job controller never ends one rank for the
// other's failure); once node B's rxe counts
// the transfer's packets, a pod on B takes the link's NIC down. B's slice
// gets the port-down taint and B's rank the Unhealthy status naming the
// port, from the driver's fast path (the rescan is an hour away); A's
// slice and rank stay healthy. B's rank then waits for its port to come
// back, which a second pod on B brings up after the checks.
func (m *multiNode) portDown() {
	t := m.t
	netdev := m.facts[nodeB]["netdev"]
	pods := m.job(rankJob{name: "long", ns: "default", command: []string{"sh", guestScripts + "/rank.sh", "portdown"}, env: rankEnv()})
	rankB := pods["0"]
	if rankB.Spec.NodeName != nodeB {
		rankB = pods["1"]
	}
	rankA := pods["0"]
	if rankA == rankB {
		rankA = pods["1"]
	}
	for _, p := range []*corev1.Pod{rankA, rankB} {
		m.wait(p.Name+" running", 5*time.Minute, func() (bool, string) {
			got, err := m.cp.Client.CoreV1().Pods("default").Get(m.ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if got.Status.Phase == corev1.PodSucceeded || got.Status.Phase == corev1.PodFailed {
				t.Fatalf("%s ended before its link went down: %+v", p.Name, got.Status.ContainerStatuses)
			}
			return got.Status.Phase == corev1.PodRunning, string(got.Status.Phase)
		})
	}
	for _, p := range []*corev1.Pod{rankA, rankB} {
		m.checkClaimStatus(p)
	}
	// The taint must come from the running driver's fast path, not from
	// the discovery of a restarted one (a TCG guest starved of CPU can
	// miss its liveness probe).
	driverBefore := m.driverContainer(nodeB)
	// Down once B's rxe has counted a few thousand of the transfer's
	// packets (a minute at most: the check below says if it never did).
	down := m.nodePod("link-down", nodeB, true, "link-down.sh", linkRxe, netdev)
	msg := m.terminationMessages(down)[down]
	downAt := time.Now()
	t.Logf("%s said: %s", down, msg)
	if !strings.Contains(msg, "down: exit 0") {
		t.Fatalf("taking %s's %s down failed: %s", nodeB, netdev, msg)
	}
	if c := regexp.MustCompile(`packets (\d+) -> (\d+)`).FindStringSubmatch(msg); c == nil {
		t.Errorf("%s: no packet counts: %q", down, msg)
	} else if before, _ := strconv.Atoi(c[1]); mustAtoi(c[2]) <= before+2000 {
		t.Errorf("%s's %s counted %s -> %s packets before the link went down: the transfer was not under way", nodeB, linkRxe, c[1], c[2])
	}

	// B: the taint on the link's rxe and the rank's Unhealthy status.
	m.wait(nodeB+"'s "+linkRxe+" tainted port-down", 2*time.Minute, func() (bool, string) {
		d, err := m.sliceDevice(nodeB, linkRxe)
		if err != nil {
			return false, err.Error()
		}
		for _, tn := range d.Taints {
			if tn.Key == driverName+"/port-down" && tn.Effect == resourceapi.DeviceTaintEffectNoSchedule {
				return true, ""
			}
		}
		return false, fmt.Sprintf("taints %+v", d.Taints)
	})
	t.Logf("%s's %s tainted port-down %s after the link went down (observed from the host)", nodeB, linkRxe, time.Since(downAt).Round(10*time.Millisecond))
	var health, healthMsg string
	m.wait(rankB.Name+"'s allocatedResourcesStatus Unhealthy", 2*time.Minute, func() (bool, string) {
		health, healthMsg = m.podHealth(rankB.Name)
		return health == string(corev1.ResourceHealthStatusUnhealthy), fmt.Sprintf("%s %q", health, healthMsg)
	})
	t.Logf("%s on %s: %s %q, %s after the link went down", rankB.Name, nodeB, health, healthMsg, time.Since(downAt).Round(10*time.Millisecond))
	if !strings.Contains(healthMsg, linkRxe) || !strings.Contains(healthMsg, "port 1") {
		t.Errorf("%s's status message %q does not name %s's port 1", rankB.Name, healthMsg, linkRxe)
	}
	// A: untouched.
	if d, err := m.sliceDevice(nodeA, linkRxe); err != nil {
		t.Error(err)
	} else if len(d.Taints) > 0 {
		t.Errorf("%s's %s: taints %+v, want none", nodeA, linkRxe, d.Taints)
	}
	if h, msg := m.podHealth(rankA.Name); h == string(corev1.ResourceHealthStatusUnhealthy) {
		t.Errorf("%s on %s: %s %q, want it untouched", rankA.Name, nodeA, h, msg)
	}

	if after := m.driverContainer(nodeB); after.id != driverBefore.id {
		t.Errorf("%s's driver restarted between the link going down and the checks (%s, then %s): the taint and health may be a new driver's discovery, not the fast path",
			nodeB, driverBefore, after)
	}
	up := m.nodePod("link-up", nodeB, true, "link-up.sh", netdev)
	t.Logf("%s said: %s", up, m.terminationMessages(up)[up])
	upAt := time.Now() // as downAt: once the host has seen the pod end
	m.wait(nodeB+"'s "+linkRxe+" untainted", 2*time.Minute, func() (bool, string) {
		d, err := m.sliceDevice(nodeB, linkRxe)
		if err != nil {
			return false, err.Error()
		}
		return len(d.Taints) == 0, fmt.Sprintf("taints %+v", d.Taints)
	})
	t.Logf("%s's %s untainted %s after the link came up", nodeB, linkRxe, time.Since(upAt).Round(10*time.Millisecond))
	// B's rank ends its transfer once its port is back; A's ends with the
	// Job if B's going away did not end it.
	msg = m.terminationMessages(rankB.Name)[rankB.Name]
	t.Logf("%s (on %s) said:\n%s", rankB.Name, nodeB, msg)
	if !strings.Contains(msg, "port after: 4: ACTIVE") {
		t.Errorf("%s: its port did not come back ACTIVE", rankB.Name)
	}
	fmt.Printf("cross-node: port-down %s/%s under ib_write_bw: taint %s and %s %q on %s; %s untouched\n",
		nodeB, linkRxe, driverName+"/port-down", rankB.Name, healthMsg, nodeB, nodeA)
	m.deleteJob("default", "long")
}

// checkClaimStatus waits for the driver's entry in the status.devices of
// the pod's claim (written after prepare, off its path) and holds it to
// the node's kernel: the link's netdev and address, its port up.
func (m *multiNode) checkClaimStatus(p *corev1.Pod) {
	t := m.t
	f := m.facts[p.Spec.NodeName]
	var why string
	m.wait(p.Name+"'s claim's status.devices", 2*time.Minute, func() (bool, string) {
		got, err := m.cp.Client.CoreV1().Pods("default").Get(m.ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		claim := ""
		for _, s := range got.Status.ResourceClaimStatuses {
			if s.Name == "rdma" && s.ResourceClaimName != nil {
				claim = *s.ResourceClaimName
			}
		}
		if claim == "" {
			return false, "no claim in the pod's status"
		}
		c, err := m.cp.Client.ResourceV1().ResourceClaims("default").Get(m.ctx, claim, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, d := range c.Status.Devices {
			if d.Driver != driverName || d.Device != linkRxe {
				continue
			}
			var bad []string
			if d.NetworkData == nil || d.NetworkData.InterfaceName != f["netdev"] {
				bad = append(bad, fmt.Sprintf("networkData %+v, want interface %s", d.NetworkData, f["netdev"]))
			} else if !slices.ContainsFunc(d.NetworkData.IPs, func(ip string) bool { return strings.HasPrefix(ip, f["address"]+"/") }) {
				bad = append(bad, fmt.Sprintf("ips %v, want %s", d.NetworkData.IPs, f["address"]))
			}
			up := false
			for _, c := range d.Conditions {
				up = up || c.Type == "LinkUp" && c.Status == metav1.ConditionTrue
			}
			if !up {
				bad = append(bad, fmt.Sprintf("conditions %+v, want LinkUp True", d.Conditions))
			}
			why = fmt.Sprintf("claim %s: %s %v, conditions %d", claim, d.Device, d.NetworkData, len(d.Conditions))
			if len(bad) > 0 {
				t.Errorf("%s on %s: claim %s's status: %s", p.Name, p.Spec.NodeName, claim, strings.Join(bad, "; "))
			}
			return true, ""
		}
		return false, fmt.Sprintf("claim %s: status.devices %+v", claim, c.Status.Devices)
	})
	t.Logf("%s on %s: %s", p.Name, p.Spec.NodeName, why)
}

// driverState is a node's driver container: its ID, restarts and the
// last one's cause.
type driverState struct{ id, why string }

func (d driverState) String() string { return d.id + " " + d.why }

func (m *multiNode) driverContainer(nodeName string) driverState {
	pods, err := m.cp.Client.CoreV1().Pods("rdma-system").List(m.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=rdma"})
	if err != nil {
		return driverState{why: err.Error()}
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != nodeName {
			continue
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.Name != "driver" {
				continue
			}
			why := fmt.Sprintf("(%d restarts", c.RestartCount)
			if l := c.LastTerminationState.Terminated; l != nil {
				why += fmt.Sprintf(", last ended %s: %s exit %d", l.FinishedAt.UTC().Format("15:04:05"), l.Reason, l.ExitCode)
			}
			return driverState{id: c.ContainerID, why: why + ")"}
		}
	}
	return driverState{why: "no driver container on " + nodeName}
}

// podHealth is the health and message of the pod's claim "rdma" in its
// container's allocatedResourcesStatus.
func (m *multiNode) podHealth(name string) (string, string) {
	p, err := m.cp.Client.CoreV1().Pods("default").Get(m.ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err.Error()
	}
	for _, cs := range p.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			if rs.Name != "claim:rdma" || len(rs.Resources) == 0 {
				continue
			}
			msg := ""
			if m := rs.Resources[0].Message; m != nil {
				msg = *m
			}
			return string(rs.Resources[0].Health), msg
		}
	}
	return "", "no claim:rdma entry"
}

// nodePod runs testdata/script with args in a busybox pod on the node
// (hostNetwork; with NET_ADMIN when netAdmin) and returns its name.
func (m *multiNode) nodePod(name, nodeName string, netAdmin bool, script string, args ...string) string {
	var caps *corev1.SecurityContext
	if netAdmin {
		caps = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}}
	}
	dir := corev1.HostPathDirectory
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{NodeName: nodeName, HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: node.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: shCommand(script, args...), SecurityContext: caps,
				VolumeMounts: []corev1.VolumeMount{{Name: "cdi", MountPath: "/node/cdi", ReadOnly: true},
					{Name: "plugin", MountPath: "/node/plugin", ReadOnly: true}}}},
			Volumes: []corev1.Volume{
				{Name: "cdi", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/cdi", Type: &dir}}},
				{Name: "plugin", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
					Path: "/var/lib/kubelet/plugins/" + driverName, Type: &dir}}}},
		}}
	if _, err := m.cp.Client.CoreV1().Pods("default").Create(m.ctx, pod, metav1.CreateOptions{}); err != nil {
		m.t.Fatal(err)
	}
	return name
}

// nothingLeft: with both Jobs gone, each node's CDI dir has no spec of
// ours and its driver's checkpoint holds no claim.
func (m *multiNode) nothingLeft() {
	t := m.t
	for _, n := range linkNodes {
		// The kubelet unprepares when the pods go; wait for the CDI dir to empty.
		p := m.nodePod("left-"+n.name, n.name, false, "left.sh")
		out := m.terminationMessages(p)[p]
		cdi, ckpt, _ := strings.Cut(out, "\n")
		if strings.TrimSpace(cdi) != "cdi:" {
			t.Errorf("%s's CDI dir after the Jobs: %s", n.name, cdi)
		}
		file := filepath.Join(m.dir, n.name+"-checkpoint.json")
		if err := os.WriteFile(file, []byte(ckpt), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := checkpoint.NewStore(file).Load()
		if err != nil {
			t.Errorf("%s's checkpoint: %v", n.name, err)
		} else if len(c.Claims) > 0 {
			t.Errorf("%s's checkpoint still holds claims %v", n.name, c.Claims)
		}
		t.Logf("%s after the Jobs: %s, checkpoint with %d claims", n.name, strings.TrimSpace(cdi), len(c.Claims))
	}
}

func ptrTo[T any](v T) *T { return &v }

// mustAtoi is s as an int, 0 when it is none (callers matched \d+).
func mustAtoi(s string) int { n, _ := strconv.Atoi(s); return n }

// rankScripts is the ConfigMap the ranks mount at guestScripts.
const rankScripts = "rank-scripts"

// createRankScripts creates rankScripts in namespace ns, once.
func (m *multiNode) createRankScripts(ns string) {
	data := map[string]string{}
	for _, f := range []string{"rank.sh", "rank-podnet.sh", "watchdog.sh"} {
		data[f] = scriptText(f)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: rankScripts}, Data: data}
	if _, err := m.cp.Client.CoreV1().ConfigMaps(ns).Create(m.ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		m.t.Fatal(err)
	}
}

// rankEnv is rank.sh's environment but PEER.
func rankEnv() []corev1.EnvVar {
	env := []corev1.EnvVar{{Name: "MD", Value: metadataPath}, {Name: "DRIVER", Value: driverName},
		{Name: "KEYS", Value: strings.Join(metadataKeys, "|")}}
	for k, v := range map[string]int{"BW_SIZE": bwSize, "BW_ITERS": bwIters, "LAT_SIZE": latSize, "LAT_ITERS": latIters,
		"RPING_SIZE": rpingSize, "RPING_COUNT": rpingCnt, "UCX_SIZE": ucxSize, "UCX_ITERS": ucxIters} {
		env = append(env, corev1.EnvVar{Name: k, Value: strconv.Itoa(v)})
	}
	slices.SortFunc(env, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
	return env
}
