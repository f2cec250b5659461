package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

const (
	ctlDriver    = "rdma.dra.dev"
	ctlClass     = "hca.rdma.dra.dev"
	ctlNode      = "n1"
	ctlPollLimit = 30 * time.Second
)

// ctlStart runs a control plane with controllers and scheduler,
// all stopped when the test ends.
func ctlStart(t *testing.T) (context.Context, *ControlPlane) {
	t.Helper()
	ctx := t.Context() // canceled before cleanups: components stop first
	start := time.Now()
	cp, err := StartControlPlane(t, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	apiserver := time.Since(start)
	start = time.Now()
	if err := StartControllers(ctx, cp); err != nil {
		t.Fatal(err)
	}
	controllers := time.Since(start)
	start = time.Now()
	if err := StartScheduler(ctx, cp); err != nil {
		t.Fatal(err)
	}
	t.Logf("startup: control plane %v, controllers %v, scheduler %v",
		apiserver.Round(time.Millisecond), controllers.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	return ctx, cp
}

// ctlPoll calls cond until it returns true, failing the test after ctlPollLimit;
// last describes the state seen, for the failure message.
func ctlPoll(ctx context.Context, t *testing.T, what string, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	if err := poll.Until(ctx, what, 200*time.Millisecond, ctlPollLimit, cond); err != nil {
		t.Fatal(err)
	}
}

// ctlMust(f())(t) returns f's value, failing t if f failed.
func ctlMust[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func ctlNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ctlCreateNode registers a schedulable node as a kubelet would (new nodes
// get a not-ready taint, which node lifecycle removes once they are Ready).
func ctlCreateNode(ctx context.Context, t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	ctlMust(c.CoreV1().Nodes().Create(ctx, &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelHostname: name}},
	}, metav1.CreateOptions{}))(t)
	resources := v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse("8"),
		v1.ResourceMemory: resource.MustParse("16Gi"),
		v1.ResourcePods:   resource.MustParse("110"),
	}
	// Node lifecycle may update the new Node concurrently.
	ctlNoErr(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.Capacity, node.Status.Allocatable = resources, resources
		node.Status.Conditions = []v1.NodeCondition{{
			Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		}}
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}))
	// The node lease keeps node lifecycle from declaring the node lost.
	go lease.NewController(clock.RealClock{}, c, name, 40, nil, 10*time.Second, name, v1.NamespaceNodeLease, nil).Run(ctx)
}

func ctlCreateNamespace(ctx context.Context, t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	ctlMust(c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}))(t)
}

func ctlCreateClass(ctx context.Context, t *testing.T, c kubernetes.Interface, name string, extendedResourceName *string) {
	t.Helper()
	ctlMust(c.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{
			Selectors:            []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + ctlDriver + `"`}}},
			ExtendedResourceName: extendedResourceName,
		},
	}, metav1.CreateOptions{}))(t)
}

func ctlDevice(name string) resourceapi.Device {
	return resourceapi.Device{
		Name: name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			ctlDriver + "/linkLayer": {StringValue: ptr.To("InfiniBand")},
		},
	}
}

func ctlCreateSlice(ctx context.Context, t *testing.T, c kubernetes.Interface, node string, devices ...resourceapi.Device) {
	t.Helper()
	ctlMust(c.ResourceV1().ResourceSlices().Create(ctx, &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + ctlDriver},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   ctlDriver,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  devices,
		},
	}, metav1.CreateOptions{}))(t)
}

func ctlCreateTemplate(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, name string) {
	t.Helper()
	ctlMust(c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name:    "hca",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: ctlClass},
			}}},
		}},
	}, metav1.CreateOptions{}))(t)
}

// ctlPodSpec is a busybox pod using template through a claim named "hca".
func ctlPodSpec(template string) v1.PodSpec {
	return v1.PodSpec{
		RestartPolicy: v1.RestartPolicyNever,
		Containers: []v1.Container{{
			Name: "main", Image: "busybox", Command: []string{"true"},
			Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "hca"}}},
		}},
		ResourceClaims: []v1.PodResourceClaim{{Name: "hca", ResourceClaimTemplateName: ptr.To(template)}},
	}
}

// ctlPodClaim returns the claim generated for pod's "hca" claim, nil while
// the resourceclaim controller has not recorded it in the pod status.
func ctlPodClaim(ctx context.Context, c kubernetes.Interface, pod *v1.Pod) (*resourceapi.ResourceClaim, error) {
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == "hca" && s.ResourceClaimName != nil {
			return c.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *s.ResourceClaimName, metav1.GetOptions{})
		}
	}
	return nil, nil
}

// ctlAllocatedTo reports whether claim has one device of our driver on node
// pool and is reserved for pod.
func ctlAllocatedTo(claim *resourceapi.ResourceClaim, pod *v1.Pod, pool string) (bool, string) {
	a := claim.Status.Allocation
	if a == nil || len(a.Devices.Results) == 0 {
		return false, fmt.Sprintf("claim %s not allocated", claim.Name)
	}
	r := a.Devices.Results[0]
	if r.Driver != ctlDriver || r.Pool != pool || r.Device == "" {
		return false, fmt.Sprintf("claim %s allocated %s/%s/%s", claim.Name, r.Driver, r.Pool, r.Device)
	}
	for _, ref := range claim.Status.ReservedFor {
		if ref.Resource == "pods" && ref.UID == pod.UID {
			return true, ""
		}
	}
	return false, fmt.Sprintf("claim %s reservedFor %v", claim.Name, claim.Status.ReservedFor)
}

// TestControllersJob: Job → pod → claim from template → allocation and
// binding → (pod succeeds) → Job complete, claim released.
func TestControllersJob(t *testing.T) {
	t.Parallel()
	ctx, cp := ctlStart(t)
	c := cp.Client
	const ns = "job"
	ctlCreateNamespace(ctx, t, c, ns)
	ctlCreateNode(ctx, t, c, ctlNode)
	ctlCreateClass(ctx, t, c, ctlClass, nil)
	ctlCreateSlice(ctx, t, c, ctlNode, ctlDevice("mlx5-0"), ctlDevice("mlx5-1"))
	ctlCreateTemplate(ctx, t, c, ns, "one-hca")
	job := ctlMust(c.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "ib"},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template:     v1.PodTemplateSpec{Spec: ctlPodSpec("one-hca")},
		},
	}, metav1.CreateOptions{}))(t)

	var pod *v1.Pod
	ctlPoll(ctx, t, "a pod of the job", func(ctx context.Context) (bool, string, error) {
		pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job.Name})
		if err != nil || len(pods.Items) == 0 {
			return false, "no pods", err
		}
		pod = &pods.Items[0]
		return true, "", nil
	})
	var claim *resourceapi.ResourceClaim
	ctlPoll(ctx, t, "the pod's claim to be allocated and the pod bound", func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		pod = p
		if claim, err = ctlPodClaim(ctx, c, pod); err != nil || claim == nil {
			return false, "no claim in pod status", err
		}
		if ok, state := ctlAllocatedTo(claim, pod, ctlNode); !ok {
			return false, state, nil
		}
		return pod.Spec.NodeName == ctlNode, "pod nodeName " + pod.Spec.NodeName, nil
	})
	r := claim.Status.Allocation.Devices.Results[0]
	t.Logf("pod %s on %s, claim %s: %s/%s/%s", pod.Name, pod.Spec.NodeName, claim.Name, r.Driver, r.Pool, r.Device)
	if len(claim.OwnerReferences) != 1 || claim.OwnerReferences[0].UID != pod.UID {
		t.Errorf("claim owner references %v, want the pod", claim.OwnerReferences)
	}

	// What a kubelet does when the container exits 0.
	ctlNoErr(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		p.Status.Phase = v1.PodSucceeded
		p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionFalse, Reason: "PodCompleted", LastTransitionTime: now})
		p.Status.ContainerStatuses = []v1.ContainerStatus{{
			Name: "main", Image: "busybox", ImageID: "docker.io/library/busybox@sha256:0", ContainerID: "containerd://0",
			State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}},
		}}
		_, err = c.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	}))

	ctlPoll(ctx, t, "the job to complete", func(ctx context.Context) (bool, string, error) {
		j, err := c.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		for _, cond := range j.Status.Conditions {
			if cond.Type == batchv1.JobComplete && cond.Status == v1.ConditionTrue {
				return j.Status.Succeeded == 1, fmt.Sprintf("succeeded=%d", j.Status.Succeeded), nil
			}
		}
		return false, fmt.Sprintf("succeeded=%d conditions=%v", j.Status.Succeeded, j.Status.Conditions), nil
	})
	ctlPoll(ctx, t, "the claim to be released", func(ctx context.Context) (bool, string, error) {
		cl, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, claim.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			t.Logf("claim %s deleted", claim.Name)
			return true, "", nil
		}
		if err != nil {
			return false, "", err
		}
		if len(cl.Status.ReservedFor) == 0 && cl.Status.Allocation == nil {
			t.Logf("claim %s deallocated", claim.Name)
			return true, "", nil
		}
		return false, fmt.Sprintf("reservedFor=%v allocated=%v deleting=%v", cl.Status.ReservedFor, cl.Status.Allocation != nil, cl.DeletionTimestamp != nil), nil
	})

	// Deleting the Job (background propagation) lets the GC delete its pod.
	ctlNoErr(t, c.BatchV1().Jobs(ns).Delete(ctx, job.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}))
	ctlPoll(ctx, t, "the garbage collector to delete the job's pod", func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		if err != nil {
			return false, "", err
		}
		return false, fmt.Sprintf("deleting=%v finalizers=%v", p.DeletionTimestamp != nil, p.Finalizers), nil
	})
}

// TestControllersExtendedResource: a pod asking for rdma/hca, an extended
// resource backed by a DeviceClass, gets a claim made by the scheduler
// from a shared (multi-allocatable) device.
func TestControllersExtendedResource(t *testing.T) {
	t.Parallel()
	ctx, cp := ctlStart(t)
	c := cp.Client
	const ns = "extended"
	ctlCreateNamespace(ctx, t, c, ns)
	ctlCreateNode(ctx, t, c, ctlNode)
	ctlCreateClass(ctx, t, c, ctlClass, ptr.To("rdma/hca"))
	shared := ctlDevice("mlx5-0")
	shared.AllowMultipleAllocations = ptr.To(true)
	shared.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		ctlDriver + "/shares": {
			Value:         resource.MustParse("1000"),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(resource.MustParse("1"))},
		},
	}
	ctlCreateSlice(ctx, t, c, ctlNode, shared)

	var pods []*v1.Pod
	for i := range 2 {
		pods = append(pods, ctlMust(c.CoreV1().Pods(ns).Create(ctx, &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("hca-%d", i)},
			Spec: v1.PodSpec{
				RestartPolicy: v1.RestartPolicyNever,
				Containers: []v1.Container{{
					Name: "main", Image: "busybox", Command: []string{"true"},
					Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"rdma/hca": resource.MustParse("1")}},
				}},
			},
		}, metav1.CreateOptions{}))(t))
	}
	for _, pod := range pods {
		var claim *resourceapi.ResourceClaim
		ctlPoll(ctx, t, pod.Name+" to be bound with an extended resource claim", func(ctx context.Context) (bool, string, error) {
			p, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			pod = p
			st := pod.Status.ExtendedResourceClaimStatus
			if st == nil {
				return false, fmt.Sprintf("nodeName=%q conditions=%v", pod.Spec.NodeName, pod.Status.Conditions), nil
			}
			if claim, err = c.ResourceV1().ResourceClaims(ns).Get(ctx, st.ResourceClaimName, metav1.GetOptions{}); err != nil {
				return false, "", err
			}
			if ok, state := ctlAllocatedTo(claim, pod, ctlNode); !ok {
				return false, state, nil
			}
			return pod.Spec.NodeName == ctlNode, "pod nodeName " + pod.Spec.NodeName, nil
		})
		st := pod.Status.ExtendedResourceClaimStatus
		r := claim.Status.Allocation.Devices.Results[0]
		t.Logf("pod %s on %s: extendedResourceClaimStatus %+v; claim annotations %v, owners %v, request %q: %s/%s/%s shareID=%v consumed=%v",
			pod.Name, pod.Spec.NodeName, *st, claim.Annotations, claim.OwnerReferences,
			r.Request, r.Driver, r.Pool, r.Device, ptr.Deref(r.ShareID, ""), r.ConsumedCapacity)
		if claim.Annotations[resourceapi.ExtendedResourceClaimAnnotation] != "true" {
			t.Errorf("claim %s lacks annotation %s=true", claim.Name, resourceapi.ExtendedResourceClaimAnnotation)
		}
		if len(st.RequestMappings) != 1 || st.RequestMappings[0].ContainerName != "main" ||
			st.RequestMappings[0].ResourceName != "rdma/hca" || st.RequestMappings[0].RequestName != r.Request {
			t.Errorf("request mappings %+v, want main/rdma/hca → %s", st.RequestMappings, r.Request)
		}
		if r.Device != "mlx5-0" || r.ShareID == nil {
			t.Errorf("want a share of mlx5-0, got device %s shareID %v", r.Device, r.ShareID)
		}
		if got := r.ConsumedCapacity[ctlDriver+"/shares"]; got.Cmp(resource.MustParse("1")) != 0 {
			t.Errorf("consumed capacity %v, want shares 1", r.ConsumedCapacity)
		}
	}
}

// TestControllersContention: two pods want the only device; the second
// waits until the first is gone.
func TestControllersContention(t *testing.T) {
	ctx, cp := ctlStart(t)
	c := cp.Client
	const ns = "contention"
	ctlCreateNamespace(ctx, t, c, ns)
	ctlCreateNode(ctx, t, c, ctlNode)
	ctlCreateClass(ctx, t, c, ctlClass, nil)
	ctlCreateSlice(ctx, t, c, ctlNode, ctlDevice("mlx5-0"))
	ctlCreateTemplate(ctx, t, c, ns, "one-hca")

	newPod := func(name string) *v1.Pod {
		return ctlMust(c.CoreV1().Pods(ns).Create(ctx, &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       ctlPodSpec("one-hca"),
		}, metav1.CreateOptions{}))(t)
	}
	bound := func(pod *v1.Pod) func(ctx context.Context) (bool, string, error) {
		return func(ctx context.Context) (bool, string, error) {
			p, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			claim, err := ctlPodClaim(ctx, c, p)
			if err != nil || claim == nil {
				return false, "no claim", err
			}
			if ok, state := ctlAllocatedTo(claim, p, ctlNode); !ok {
				return false, state, nil
			}
			return p.Spec.NodeName == ctlNode, "nodeName " + p.Spec.NodeName, nil
		}
	}
	first := newPod("first")
	ctlPoll(ctx, t, "first to be bound", bound(first))
	second := newPod("second")
	ctlPoll(ctx, t, "second to be unschedulable", func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, second.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		if p.Spec.NodeName != "" {
			return false, "", fmt.Errorf("second was bound to %s while first holds the only device", p.Spec.NodeName)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable {
				t.Logf("second: %s", cond.Message)
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("conditions %v", p.Status.Conditions), nil
	})

	// No kubelet: a bound pod that is not terminal would wait for one to
	// confirm a graceful deletion, so delete it at once.
	ctlNoErr(t, c.CoreV1().Pods(ns).Delete(ctx, first.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	ctlPoll(ctx, t, "second to be bound after first is gone", bound(second))
}

// TestControllersFeatureGates: the DRA features the scheduler needs are on
// by default, without anyone setting them.
func TestControllersFeatureGates(t *testing.T) {
	if err := checkFeatures(); err != nil {
		t.Fatal(err)
	}
}
