package main

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/util/flowcontrol"
)

// TestHelperClient: the helper's claim GETs go through the kubelet client,
// its ResourceSlices and Node reads through the publish client.
func TestHelperClient(t *testing.T) {
	kubelet, publish := fake.NewClientset(), fake.NewClientset()
	c := apiClients{kubelet: kubelet, publish: publish}.helperClient()
	ctx := context.Background()
	_, _ = c.ResourceV1().ResourceClaims("default").Get(ctx, "claim", metav1.GetOptions{})
	_, _ = c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	_, _ = c.CoreV1().Nodes().Get(ctx, "dgx01", metav1.GetOptions{})
	resources := func(f *fake.Clientset) []string {
		var out []string
		for _, a := range f.Actions() {
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
		}
		return out
	}
	if got := resources(kubelet); len(got) != 1 || got[0] != "get resourceclaims" {
		t.Errorf("kubelet client: %v, want [get resourceclaims]", got)
	}
	if got := resources(publish); len(got) != 2 || got[0] != "list resourceslices" || got[1] != "get nodes" {
		t.Errorf("publish client: %v, want [list resourceslices get nodes]", got)
	}
}

// TestYieldingLimiter: a status write waits while a prepare or unprepare is
// in flight and goes when it ends; other gRPC methods do not hold it; a
// call that never ends holds it for max only.
func TestYieldingLimiter(t *testing.T) {
	gate := newCallGate()
	l := yieldingLimiter{RateLimiter: flowcontrol.NewTokenBucketRateLimiter(1000, 1000), gate: gate, max: time.Hour}
	ctx := context.Background()
	release := make(chan struct{})
	handler := func(context.Context, any) (any, error) { <-release; return nil, nil }
	for _, method := range []string{"/v1.DRAPlugin/NodePrepareResources", "/v1.DRAPlugin/NodeUnprepareResources"} {
		served := make(chan struct{})
		go func() {
			_, _ = gate.interceptor(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, handler)
			close(served)
		}()
		if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			gate.mu.Lock()
			defer gate.mu.Unlock()
			return gate.inFlight == 1, nil
		}); err != nil {
			t.Fatalf("%s not in flight: %v", method, err)
		}
		wrote := make(chan error)
		go func() { wrote <- l.Wait(ctx) }()
		select {
		case err := <-wrote:
			t.Fatalf("%s in flight: the status write went (%v)", method, err)
		case <-time.After(50 * time.Millisecond):
		}
		release <- struct{}{}
		<-served
		if err := <-wrote; err != nil {
			t.Fatalf("after %s: %v", method, err)
		}
	}

	// Not a prepare: not counted.
	go func() {
		_, _ = gate.interceptor(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/v1.DRAPlugin/Other"}, handler)
	}()
	if err := l.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	release <- struct{}{}

	gate.enter() // never leaves
	l.max = time.Millisecond
	if err := l.Wait(ctx); err != nil {
		t.Errorf("with a call stuck in flight: %v, want the write to go after max", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	l.max = time.Hour
	if err := l.Wait(cancelled); err == nil {
		t.Error("a cancelled context did not end the wait")
	}
}
