package vm

// The seed's other mode across the two nodes (issue 30): RDMA for pods on
// their own network, which is what pods under the restricted Pod Security
// Standard get (it forbids host namespaces). A second Indexed Job runs in a
// namespace that enforces restricted: ranks as uid 1000 with every
// capability dropped, RuntimeDefault seccomp, no privilege escalation and
// no /dev/shm volume, on the pods' addresses (each node hands out its own
// pod subnet; the guests route them to each other over the link), moving
// data over the nodes' RoCE GIDs (shared netns mode: a pod sees the host's
// GID table). The memlock RDMA needs comes from the driver's hook, not
// from IPC_LOCK. testdata/rank-podnet.sh says which clients cannot work in
// this mode and why (RDMA-CM).

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	restrictedNS  = "rdma-restricted"
	restrictedUID = 1000
	// Modest transfers: TCG; the hostNetwork Job moves the bigger ones.
	podnetBwIters, podnetUCXIters = 100, 100
)

// podnetTools are rank-podnet.sh's transfers, in its order.
var podnetTools = []string{"ib_write_bw", "ucx_perftest"}

// restrictedTransfers runs the restricted Job and prints one
// "cross-node (pod network, restricted):" line per transfer.
func (m *multiNode) restrictedTransfers() {
	t := m.t
	begin := time.Now()
	m.restrictedNamespace()
	started := time.Now()
	env := []corev1.EnvVar{{Name: "BW_ITERS", Value: strconv.Itoa(podnetBwIters)}, {Name: "BW_SIZE", Value: strconv.Itoa(bwSize)},
		{Name: "UCX_ITERS", Value: strconv.Itoa(podnetUCXIters)}, {Name: "UCX_SIZE", Value: strconv.Itoa(ucxSize)}}
	pods := m.job(rankJob{name: "podnet", ns: restrictedNS, command: []string{"sh", guestScripts + "/rank-podnet.sh"}, env: env, podNetwork: true})
	msgs := m.terminationMessagesIn(restrictedNS, pods["0"].Name, pods["1"].Name)
	t.Logf("the restricted job's ranks ended %s after its creation", time.Since(started).Round(100*time.Millisecond))
	ibdev := map[string]string{}
	for i, p := range pods {
		if got, err := m.cp.Client.CoreV1().Pods(restrictedNS).Get(m.ctx, p.Name, metav1.GetOptions{}); err == nil {
			p = got // with its pod IP
			pods[i] = got
		}
		t.Logf("%s/%s (rank %s on %s, pod IP %s) said:\n%s", restrictedNS, p.Name, p.Labels["batch.kubernetes.io/job-completion-index"], p.Spec.NodeName, p.Status.PodIP, msgs[p.Name])
		ibdev[p.Spec.NodeName] = m.checkRestrictedRank(p, msgs[p.Name])
	}
	client := msgs[pods["1"].Name]
	var lines []string
	for _, tool := range podnetTools {
		status := regexp.MustCompile(`(?m)^` + tool + ` exit=(\d+) secs=([\d.]+)$`).FindStringSubmatch(client)
		if status == nil || status[1] != "0" {
			t.Errorf("%s (pod network, restricted): the client failed or said nothing: %v", tool, status)
			continue
		}
		if srv := regexp.MustCompile(`(?m)^` + tool + ` exit=0 `).FindString(msgs[pods["0"].Name]); srv == "" {
			t.Errorf("%s (pod network, restricted): the server (rank 0) did not exit 0", tool)
		}
		r := regexp.MustCompile(`(?m)^` + tool + `\| (.*)$`).FindStringSubmatch(client)
		if r == nil {
			t.Errorf("%s (pod network, restricted): no result line in the client's output", tool)
			continue
		}
		n, err := transferBytes(tool, r[1])
		if err != nil || n <= 0 {
			t.Errorf("%s (pod network, restricted): bytes moved %d (%v) from %q", tool, n, err, r[1])
			continue
		}
		lines = append(lines, fmt.Sprintf("cross-node (pod network, restricted): %s %d bytes %s/%s <-> %s/%s in %ss",
			tool, n, nodeA, ibdev[nodeA], nodeB, ibdev[nodeB], status[2]))
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	m.deleteJob(restrictedNS, "podnet")
	t.Logf("the restricted Job's step (namespace, Job, checks, its pods gone) took %s", time.Since(begin).Round(100*time.Millisecond))
}

// restrictedNamespace creates restrictedNS, enforcing the restricted Pod
// Security Standard, checks that the API server enforces it (the
// hostNetwork ranks' pod is refused there), and gives it the Jobs'
// ResourceClaimTemplate.
func (m *multiNode) restrictedNamespace() {
	t := m.t
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: restrictedNS, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}
	if _, err := m.cp.Client.CoreV1().Namespaces().Create(m.ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"rdma-vm-job": "psa-probe"}
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "psa-probe", Labels: labels},
		Spec: rankJob{name: "psa-probe", command: []string{"true"}}.podSpec(labels)}
	_, err := m.cp.Client.CoreV1().Pods(restrictedNS).Create(m.ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) || !strings.Contains(fmt.Sprint(err), `violates PodSecurity "restricted`) {
		t.Fatalf("namespace %s: a hostNetwork pod with IPC_LOCK was not refused by Pod Security admission: %v", restrictedNS, err)
	}
	t.Logf("namespace %s enforces restricted: the hostNetwork ranks' pod is refused: %v", restrictedNS, err)
	m.createTemplate(restrictedNS)
}

// checkRestrictedRank holds what a restricted rank said of itself to its
// node: uid 1000, no capability, no_new_privs, the memlock the hook gave
// it, exactly rdma_cm and its claim's uverbs node, the driver's hints for
// a pod on its own network (the family and RoCE version, no GID index,
// UCX's device), the GID they lead to being its node's link address, its
// pod address in its node's pod subnet, and UCX on the link's rxe. It
// returns the device the rank used (RDMA_DEVICES).
func (m *multiNode) checkRestrictedRank(p *corev1.Pod, out string) string {
	t := m.t
	f := m.facts[p.Spec.NodeName]
	zero := "0000000000000000"
	for _, w := range []string{
		fmt.Sprintf("uid=%d gid=%d capeff=%s capbnd=%s nnp=1 memlock=unlimited/unlimited\n", restrictedUID, restrictedUID, zero, zero),
		fmt.Sprintf("env: dev=%s hca==%s family=AF_INET roce=2 ncclgid= ucxgid= ucxdev=%s:1 gidx=%s gidaddr=%s\n",
			linkRxe, linkRxe, linkRxe, f["roceGIDIndex"], f["gid"]),
		"devices: rdma_cm " + f["uverbs"] + " shm:",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("%s on %s: no %q in what its container said", p.Name, p.Spec.NodeName, strings.TrimSpace(w))
		}
	}
	if tls := regexp.MustCompile(`(?m)^ucx_perftest transports: (.*)$`).FindStringSubmatch(out); tls == nil || !strings.Contains(tls[1], "_verbs/"+linkRxe+":1") {
		t.Errorf("%s on %s: UCX did not use %s's verbs transports: %v", p.Name, p.Spec.NodeName, linkRxe, tls)
	}
	for _, n := range linkNodes {
		if n.name != p.Spec.NodeName {
			continue
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !netip.MustParsePrefix(n.podCIDR).Contains(ip) {
			t.Errorf("%s on %s: pod IP %q is not in its node's pod subnet %s", p.Name, p.Spec.NodeName, p.Status.PodIP, n.podCIDR)
		}
	}
	if dev := regexp.MustCompile(`(?m)^env: dev=(\S+)`).FindStringSubmatch(out); dev != nil {
		return dev[1]
	}
	return ""
}
