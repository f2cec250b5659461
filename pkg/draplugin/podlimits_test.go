package draplugin_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// consuming sets the capacities c consumed on its first device and
// reserves it for pods (created when missing), as the scheduler would.
func (e *env) consuming(c *resourceapi.ResourceClaim, consumed map[string]int64, pods ...string) *resourceapi.ResourceClaim {
	e.t.Helper()
	q := map[resourceapi.QualifiedName]resource.Quantity{}
	for k, v := range consumed {
		q[resourceapi.QualifiedName("rdma.dra.dev/"+k)] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	c.Status.Allocation.Devices.Results[0].ConsumedCapacity = q
	if len(pods) > 0 {
		c.Status.ReservedFor = nil
	}
	for _, name := range pods {
		pod := hostNetworkPod(name, true)
		if _, err := e.client.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
			e.t.Fatal(err)
		}
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: name, UID: pod.UID})
	}
	c, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// limitHooks are the args of the limit hooks in the spec of CDI ids.
func (e *env) limitHooks(ids []string) [][]string {
	return slices.DeleteFunc(hookArgs(e.container(ids...)), func(a []string) bool { return a[1] != "limit" })
}

// TestPodLimits: a claim's limit hook also carries the rdma.max of its
// pods' cgroups: the sum of what the pod's claims on that HCA consumed,
// the same in every claim's spec of the pod (a claim prepared before for
// the same pod has its spec rewritten); unlimited where one claim on the
// HCA is; a claim reserved for several pods gives each an even share,
// and is refused when a pod's share would be nothing.
func TestPodLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.cfg.Shares, e.cfg.AllowNonHostNetwork = 1000, true
	e.withLimits(testHook)
	e.start()
	pod := func(name string) *corev1.Pod { return hostNetworkPod(name, true) }

	// Pod p: a (3 objects), then b (1 handle, 2 objects), both on mlx5_8.
	a := e.consuming(e.claim("a", pod("p"), shared("mlx5-8", "55555555-aaaa-4aaa-8aaa-000000000001")), map[string]int64{"hcaObjects": 3})
	idsA := e.mustPrepare(a)
	b := e.consuming(e.claim("b", pod("p"), shared("mlx5-8", "55555555-aaaa-4aaa-8aaa-000000000002")), map[string]int64{"hcaHandles": 1, "hcaObjects": 2})
	idsB := e.mustPrepare(b)
	// Pod q: a limited claim and an unlimited one on mlx5_7.
	l := e.consuming(e.claim("l", pod("q"), shared("mlx5-7", "55555555-aaaa-4aaa-8aaa-000000000003")), map[string]int64{"hcaHandles": 1})
	u := e.claim("u", pod("q"), shared("mlx5-7", "55555555-aaaa-4aaa-8aaa-000000000004"))
	idsL, _ := e.mustPrepare(l), e.mustPrepare(u)
	// Claim s, reserved for pods r1 and r2: 10 objects, 5 each.
	s := e.consuming(e.claim("s", nil, shared("mlx5-6", "55555555-aaaa-4aaa-8aaa-000000000005")), map[string]int64{"hcaObjects": 10}, "r1", "r2")
	idsS := e.mustPrepare(s)

	hook := []string{"rdma-dra-hook", "limit"}
	for _, tt := range []struct {
		name string
		ids  []string
		want [][]string
	}{
		{"a, rewritten when b was prepared", idsA, [][]string{append(hook, "--device=mlx5_8", "--hca-handle=max", "--hca-object=3", "--pod=pod-p:max:5")}},
		{"b", idsB, [][]string{append(hook, "--device=mlx5_8", "--hca-handle=1", "--hca-object=2", "--pod=pod-p:max:5")}},
		{"l, beside an unlimited claim", idsL, [][]string{append(hook, "--device=mlx5_7", "--hca-handle=1", "--hca-object=max", "--pod=pod-q:max:max")}},
		{"s, shared by two pods", idsS, [][]string{append(hook, "--device=mlx5_6", "--hca-handle=max", "--hca-object=5", "--pod=pod-r1:max:5", "--pod=pod-r2:max:5")}},
	} {
		if got := e.limitHooks(tt.ids); !slices.EqualFunc(got, tt.want, slices.Equal) {
			t.Errorf("%s: limit hooks %q, want %q", tt.name, got, tt.want)
		}
	}

	// Three pods cannot share 2 objects.
	x := e.consuming(e.claim("x", nil, shared("mlx5-5", "55555555-aaaa-4aaa-8aaa-000000000006")), map[string]int64{"hcaObjects": 2}, "x1", "x2", "x3")
	want := "device mlx5-5: the claim consumed hcaObjects 2, which its 3 pods cannot share (each pod gets an even part of a shared claim's limits): ask for at least 3"
	if r := e.prepare(x)[string(x.UID)]; !strings.Contains(r.Error, want) {
		t.Errorf("a claim of 2 objects for 3 pods: error %q, want %q", r.Error, want)
	}

	// b gone: a's pod limit is its own again once a is prepared anew.
	e.unprepare(ref(b))
	if got, want := e.limitHooks(e.mustPrepare(a)), [][]string{append(hook, "--device=mlx5_8", "--hca-handle=max", "--hca-object=3", "--pod=pod-p:max:3")}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("a after b's unprepare: limit hooks %q, want %q", got, want)
	}
}
