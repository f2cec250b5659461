package main

// The daemon's API clients. Each has its own rate limiter, so that no
// background request ever takes a token a prepare is waiting for
// (docs/performance.md, "API budget per node"):
//   - kubelet: the calls a prepare waits for, the helper's claim GET and a
//     pod the informer has not seen yet (--kube-api-qps, --kube-api-burst);
//   - publish: ResourceSlices (the helper's controller), the Node;
//   - status: claims' status.devices, which also wait for the kubelet's
//     calls in flight to end (callGate).

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	resourcev1 "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Budgets of the background clients. A node's slices change when its
// HCAs do; a claim's status is written twice in its life (prepare,
// unprepare), latest wins per claim, and a late one costs a reader only.
const (
	publishQPS, publishBurst = 5, 10
	statusQPS, statusBurst   = 5, 10
	// statusMaxYield bounds how long a status write waits for the
	// kubelet's calls to pause, so a node that never stops preparing
	// still gets its statuses written at statusQPS.
	statusMaxYield = 2 * time.Second
)

// apiClients are the daemon's clients, one rate limiter each.
type apiClients struct {
	kubelet kubernetes.Interface
	publish kubernetes.Interface
	status  kubernetes.Interface
}

// newClients builds the three clients from the kubeconfig (or the
// in-cluster config), named after the node and their role in the API
// server's logs. The status client waits for gate to be idle.
func newClients(o *options, gate *callGate) (apiClients, error) {
	base, err := restConfig(o.kubeconfig)
	if err != nil {
		return apiClients{}, err
	}
	build := func(role string, qps float32, burst int, wrap func(flowcontrol.RateLimiter) flowcontrol.RateLimiter) (kubernetes.Interface, error) {
		cfg := rest.CopyConfig(base)
		cfg.QPS, cfg.Burst = qps, burst
		cfg.UserAgent = fmt.Sprintf("rdma-dra-driver/%s (%s)", o.nodeName, role)
		if wrap != nil {
			cfg.RateLimiter = wrap(flowcontrol.NewTokenBucketRateLimiter(qps, burst))
		}
		return kubernetes.NewForConfig(cfg)
	}
	var c apiClients
	if c.kubelet, err = build("kubelet", o.kubeAPIQPS, o.kubeAPIBurst, nil); err != nil {
		return c, err
	}
	if c.publish, err = build("publish", publishQPS, publishBurst, nil); err != nil {
		return c, err
	}
	c.status, err = build("status", statusQPS, statusBurst, func(l flowcontrol.RateLimiter) flowcontrol.RateLimiter {
		return yieldingLimiter{RateLimiter: l, gate: gate, max: statusMaxYield}
	})
	return c, err
}

// helperClient is what the kubeletplugin helper gets: its claim GETs (the
// kubelet's path) through the kubelet client, everything else (the
// ResourceSlice controller, the Node) through the publish client.
func (c apiClients) helperClient() kubernetes.Interface {
	return claimsThrough{Interface: c.publish, claims: c.kubelet.ResourceV1()}
}

type claimsThrough struct {
	kubernetes.Interface
	claims resourcev1.ResourceV1Interface
}

func (c claimsThrough) ResourceV1() resourcev1.ResourceV1Interface {
	return resourceClaimsThrough{ResourceV1Interface: c.Interface.ResourceV1(), claims: c.claims}
}

type resourceClaimsThrough struct {
	resourcev1.ResourceV1Interface
	claims resourcev1.ResourceV1Interface
}

func (c resourceClaimsThrough) ResourceClaims(namespace string) resourcev1.ResourceClaimInterface {
	return c.claims.ResourceClaims(namespace)
}

// callGate counts the kubelet's prepare and unprepare calls in flight.
type callGate struct {
	mu       sync.Mutex
	inFlight int
	idle     chan struct{} // closed while inFlight is 0
}

func newCallGate() *callGate {
	idle := make(chan struct{})
	close(idle)
	return &callGate{idle: idle}
}

func (g *callGate) enter() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight == 0 {
		g.idle = make(chan struct{})
	}
	g.inFlight++
}

func (g *callGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight--
	if g.inFlight == 0 {
		close(g.idle)
	}
}

// waitIdle returns when no call is in flight, after max, or when ctx ends.
func (g *callGate) waitIdle(ctx context.Context, max time.Duration) error {
	g.mu.Lock()
	idle := g.idle
	g.mu.Unlock()
	select {
	case <-idle:
		return nil
	default:
	}
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// interceptor counts the DRA service's prepare and unprepare calls.
func (g *callGate) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !strings.HasSuffix(info.FullMethod, "/NodePrepareResources") && !strings.HasSuffix(info.FullMethod, "/NodeUnprepareResources") {
		return handler(ctx, req)
	}
	g.enter()
	defer g.leave()
	return handler(ctx, req)
}

// yieldingLimiter takes a token from its own bucket, then lets the
// request go when the kubelet's calls have paused (or after max).
type yieldingLimiter struct {
	flowcontrol.RateLimiter
	gate *callGate
	max  time.Duration
}

func (l yieldingLimiter) Wait(ctx context.Context) error {
	if err := l.RateLimiter.Wait(ctx); err != nil {
		return err
	}
	return l.gate.waitIdle(ctx, l.max)
}

func (l yieldingLimiter) Accept() {
	l.RateLimiter.Accept()
	_ = l.gate.waitIdle(context.Background(), l.max)
}
