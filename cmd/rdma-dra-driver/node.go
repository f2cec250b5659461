package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// cachedNodes answers GETs of this node's Node from a watch of it: a
// prepare that moves netdevs (its InternalIPs) and the foreign-plugin check
// read the cache, not the API server. Another name, or a Node the watch
// has not delivered, is read from the API server.
type cachedNodes struct {
	corev1client.NodeInterface
	lister  corelisters.NodeLister
	synced  cache.InformerSynced
	factory informers.SharedInformerFactory
}

func newCachedNodes(client kubernetes.Interface, name string) *cachedNodes {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	nodes := factory.Core().V1().Nodes()
	return &cachedNodes{NodeInterface: client.CoreV1().Nodes(), lister: nodes.Lister(), synced: nodes.Informer().HasSynced, factory: factory}
}

// Start runs the watch until ctx ends and waits up to wait for the first
// list. An error (no list in time: the API server down, or RBAC without
// list and watch on nodes) is not fatal: until the watch has the Node,
// Get reads it from the API server.
func (c *cachedNodes) Start(ctx context.Context, wait time.Duration) error {
	c.factory.Start(ctx.Done())
	waitCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if !cache.WaitForCacheSync(waitCtx.Done(), c.synced) {
		return fmt.Errorf("the watch of the Node did not list it within %s; reading it from the API server until it does", wait)
	}
	return nil
}

// Get returns a copy of the cached Node, else the API server's.
func (c *cachedNodes) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error) {
	node, err := c.lister.Get(name)
	if err == nil {
		return node.DeepCopy(), nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	return c.NodeInterface.Get(ctx, name, opts)
}
