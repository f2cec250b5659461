package e2e

// The hostNetwork switch and the admin's settings on a real node, tried as
// a tenant would walk around them (docs/security.md lists these tests).
// The pod admission policy is off in this install: these are the checks
// that hold without it, in the driver's prepare and in the hook the
// runtime runs before a container's process starts.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

func TestRealNodePolicy(t *testing.T) {
	t.Parallel() // a real node of its own: see parallel in main_test.go
	w := newRealWorld(t)
	// Shared HCAs (claims many pods join) and the device-plugin route; no
	// admission policy, non-hostNetwork RDMA off (the default).
	const values = `,"sharing":"shared","legacy":{"route":"device-plugin"},"policies":{"podRDMA":{"enabled":false}}`
	w.install(t, "rdma-policy", values)
	w.waitDevicePlugin(t)

	w.scenario(t, "SharedClaimJoin", w.policyReset, w.policySharedClaimJoin)
	w.scenario(t, "DevicePluginPodNetwork", w.policyReset, w.policyDevicePluginPodNetwork)
	w.scenario(t, "InitContainer", w.policyReset, w.policyInitContainer)
	w.scenario(t, "ManagementDevices", w.policyReset, w.policyManagementDevices)
	w.scenario(t, "Memlock", w.policyReset, w.policyMemlock)

	// The same pods where the switch allows them.
	w.uninstall(t)
	w.install(t, "rdma-policy-allow", values+`,"allowNonHostNetwork":true`)
	w.waitDevicePlugin(t)
	w.scenario(t, "SwitchOn", w.policyReset, w.policySwitchOn)
	w.scenario(t, "SeedJobRestricted", w.policyReset, w.seedJobDRA)
}

func (w *realWorld) waitDevicePlugin(t *testing.T) {
	t.Helper()
	poll.For(t, "rdma/hca on "+w.n.Name+" (the kubelet's device manager)", time.Minute, func() (bool, string) {
		no, err := w.cp.Client.CoreV1().Nodes().Get(w.ctx, w.n.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		q := no.Status.Allocatable["rdma/hca"]
		return q.Value() > 0, fmt.Sprintf("allocatable %v", no.Status.Allocatable)
	})
}

// policyReset deletes the scenario's pods and claims and waits until the
// driver holds no claim (the device plugin's node-wide spec stays).
func (w *realWorld) policyReset(t *testing.T) {
	t.Helper()
	w.clearDefault(t, 0)
}

// policyPod runs tickScript in busybox; mutate adjusts it.
func (w *realWorld) policyPod(t *testing.T, name string, hostNetwork bool, mutate ...func(*corev1.Pod)) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, HostNetwork: hostNetwork, TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{Name: "c", Image: "busybox", ImagePullPolicy: corev1.PullNever, Command: []string{"sh", "-c", tickScript}}}},
	}
	for _, m := range mutate {
		m(pod)
	}
	if _, err := w.cp.Client.CoreV1().Pods("default").Create(w.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func withClaim(claim string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimName: ptr(claim)}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "rdma"}}
	}
}

func rdmaHCALimit() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Limits: corev1.ResourceList{"rdma/hca": resource.MustParse("1")}}
}

func withDevicePlugin(p *corev1.Pod) { p.Spec.Containers[0].Resources = rdmaHCALimit() }

// createClaim creates a claim for one HCA of class with opaque configs.
func (w *realWorld) createClaim(t *testing.T, name, class string, configs ...string) {
	t.Helper()
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "hca", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}},
		}},
	}
	for _, cfg := range configs {
		c.Spec.Devices.Config = append(c.Spec.Devices.Config, resourceapi.DeviceClaimConfiguration{
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: "rdma.dra.dev", Parameters: runtime.RawExtension{Raw: []byte(cfg)}}},
		})
	}
	if _, err := w.cp.Client.ResourceV1().ResourceClaims("default").Create(w.ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitWarning waits for a Warning event of the pod containing every want
// and returns its message.
func (w *realWorld) waitWarning(t *testing.T, pod string, want ...string) string {
	t.Helper()
	var msg string
	poll.For(t, fmt.Sprintf("a warning for pod %s saying %q", pod, want), 2*time.Minute, func() (bool, string) {
		evs, err := w.cp.Client.CoreV1().Events("default").List(w.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.Type != corev1.EventTypeWarning {
				continue
			}
			ok := true
			for _, s := range want {
				ok = ok && strings.Contains(e.Message, s)
			}
			if ok {
				msg = e.Source.Component + " " + e.Reason + ": " + e.Message
				return true, ""
			}
		}
		return false, w.events(pod)
	})
	t.Logf("pod %s: %s", pod, msg)
	return msg
}

// neverRan checks that the pod's container never ran: no status of it
// says running or started, and it wrote no log.
func (w *realWorld) neverRan(t *testing.T, pod, container string) {
	t.Helper()
	p := w.pod(t, pod)
	for _, s := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		if s.Name != container {
			continue
		}
		// A container whose start failed reports no start time (or the
		// epoch) and a non-zero exit.
		term := s.State.Terminated
		if s.State.Running != nil || term != nil && (term.ExitCode == 0 || term.StartedAt.Unix() > 0) || s.Started != nil && *s.Started {
			t.Errorf("pod %s container %s ran: %+v", pod, container, s)
		}
	}
	if p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded {
		t.Errorf("pod %s is %s, want it never to run", pod, p.Status.Phase)
	}
	b, _ := w.cp.Client.CoreV1().Pods("default").GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(w.ctx)
	if strings.Contains(string(b), "tick") {
		t.Errorf("pod %s container %s wrote %q", pod, container, b)
	}
}

// keepsTicking checks that a running pod goes on: two more ticks.
func (w *realWorld) keepsTicking(t *testing.T, pod string) string {
	t.Helper()
	got := w.waitTicks(t, pod, 0)
	last := got[len(got)-1]
	after := w.waitTicks(t, pod, last.n+1)
	return after[len(after)-1].devs
}

// hookRefusal is what the hook says for a container off the host network.
func hookRefusal(pod, container string) []string {
	return []string{"rdma-dra-hook:", fmt.Sprintf("refused to container %s of pod default/%s: it is not on the host network", container, pod),
		"--allow-non-host-network=false"}
}

// A claim prepared for a hostNetwork pod is joined by a pod off the host
// network: the kubelet does not prepare the claim again, so prepare never
// sees the second pod; the hook refuses its container, and the first pod
// keeps its HCA.
func (w *realWorld) policySharedClaimJoin(t *testing.T) {
	w.createClaim(t, "shared-hca", "hca.rdma.dra.dev")
	w.policyPod(t, "host-a", true, withClaim("shared-hca"))
	w.waitPhase(t, corev1.PodRunning, "host-a")
	before := w.keepsTicking(t, "host-a")
	w.policyPod(t, "join-b", false, withClaim("shared-hca"))
	w.waitWarning(t, "join-b", hookRefusal("join-b", "c")...)
	w.neverRan(t, "join-b", "c")
	if after := w.keepsTicking(t, "host-a"); after != before || !strings.Contains(after, "uverbs") {
		t.Errorf("host-a sees %q after the refusal, %q before", after, before)
	}
}

// rdma/hca through the kubelet's device manager, which tells the plugin
// no pod: a pod off the host network is refused at its container's start,
// a hostNetwork pod beside it gets every HCA.
func (w *realWorld) policyDevicePluginPodNetwork(t *testing.T) {
	w.policyPod(t, "dp-host", true, withDevicePlugin)
	w.policyPod(t, "dp-podnet", false, withDevicePlugin)
	w.waitWarning(t, "dp-podnet", hookRefusal("dp-podnet", "c")...)
	w.neverRan(t, "dp-podnet", "c")
	w.waitPhase(t, corev1.PodRunning, "dp-host")
	if got := w.keepsTicking(t, "dp-host"); strings.Count(got, "uverbs") != len(w.devices) {
		t.Errorf("dp-host sees %q, want every HCA (%d)", got, len(w.devices))
	}
}

// An init container asks for rdma/hca in a pod off the host network (the
// old admission policy looked at spec.containers only): refused at its
// start; the pod's main container never runs either.
func (w *realWorld) policyInitContainer(t *testing.T) {
	w.policyPod(t, "init-podnet", false, func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", ImagePullPolicy: corev1.PullNever,
			Command: []string{"sh", "-c", "ls /dev/infiniband"}, Resources: rdmaHCALimit()}}
	})
	w.policyPod(t, "bystander", true, withDevicePlugin)
	w.waitWarning(t, "init-podnet", hookRefusal("init-podnet", "init")...)
	w.neverRan(t, "init-podnet", "init")
	w.neverRan(t, "init-podnet", "c")
	w.waitPhase(t, corev1.PodRunning, "bystander")
	w.keepsTicking(t, "bystander")
}

// A claim asks, in its own config, for the management devices (umad,
// issm) its DeviceClass does not grant: prepare refuses it, naming the
// field and the class. A class that grants them hands them out.
func (w *realWorld) policyManagementDevices(t *testing.T) {
	const mgmt = `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","managementDevices":true}`
	w.createClaim(t, "wants-mad", "hca.rdma.dra.dev", mgmt)
	w.policyPod(t, "mad", true, withClaim("wants-mad"))
	w.waitWarning(t, "mad", "managementDevices: true", `DeviceClass "hca.rdma.dra.dev" does not`)
	w.neverRan(t, "mad", "c")

	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "hca-mgmt.rdma.dra.dev"},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "rdma.dra.dev" && device.attributes["rdma.dra.dev"].linkLayer == "InfiniBand"`}}},
			Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: "rdma.dra.dev", Parameters: runtime.RawExtension{Raw: []byte(mgmt)}}}}},
		},
	}
	if _, err := w.cp.Client.ResourceV1().DeviceClasses().Create(w.ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.cp.Client.ResourceV1().DeviceClasses().Delete(w.ctx, class.Name, metav1.DeleteOptions{}) }()
	w.createClaim(t, "granted-mad", class.Name, mgmt)
	w.policyPod(t, "admin-mad", true, withClaim("granted-mad"))
	w.waitPhase(t, corev1.PodRunning, "admin-mad")
	if got := w.keepsTicking(t, "admin-mad"); !strings.Contains(got, "umad") || !strings.Contains(got, "issm") {
		t.Errorf("admin-mad sees %q, want umad and issm from its class's grant", got)
	}
}

// With allowNonHostNetwork=true the pods refused above run: the join of a
// shared claim and a device-plugin pod, both off the host network.
func (w *realWorld) policySwitchOn(t *testing.T) {
	w.createClaim(t, "shared-hca", "hca.rdma.dra.dev")
	w.policyPod(t, "host-a", true, withClaim("shared-hca"))
	w.waitPhase(t, corev1.PodRunning, "host-a")
	w.policyPod(t, "join-b", false, withClaim("shared-hca"))
	w.policyPod(t, "dp-podnet", false, withDevicePlugin)
	w.waitPhase(t, corev1.PodRunning, "join-b", "dp-podnet")
	for _, pod := range []string{"host-a", "join-b", "dp-podnet"} {
		if got := w.keepsTicking(t, pod); !strings.Contains(got, "uverbs") {
			t.Errorf("%s sees %q, want its HCA", pod, got)
		}
	}
}
