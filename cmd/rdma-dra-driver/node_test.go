package main

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
)

// TestCachedNodes: this node's Node is read from the watch, with no GET,
// and a change reaches it; a Node the cache does not have is read from
// the API server.
func TestCachedNodes(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dgx01"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}}}
	client := fake.NewClientset(node)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nodes := newCachedNodes(client, "dgx01")
	if err := nodes.Start(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	gets := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "nodes" {
				n++
			}
		}
		return n
	}
	got, err := nodes.Get(ctx, "dgx01", metav1.GetOptions{})
	if err != nil || got.Status.Addresses[0].Address != "10.0.0.1" {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if n := gets(); n != 0 {
		t.Errorf("%d Node GETs for a cached Node, want 0", n)
	}

	changed := node.DeepCopy()
	changed.Status.Addresses[0].Address = "10.0.0.2"
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := nodes.Get(ctx, "dgx01", metav1.GetOptions{})
		return err == nil && got.Status.Addresses[0].Address == "10.0.0.2", nil
	})
	if err != nil {
		t.Errorf("the changed InternalIP did not reach the cache: %v", err)
	}

	// (The fake client ignores the field selector: a Node missing from
	// the API server stands for one the watch does not have.)
	before := gets()
	if _, err := nodes.Get(ctx, "gone", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a Node not in the cache: %v, want the API server's NotFound", err)
	}
	if n := gets() - before; n != 1 {
		t.Errorf("a Node not in the cache: %d GETs, want 1", n)
	}
}
