package draplugin

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// PodInformer serves pod lookups for the hot path from a watch of this
// node's pods, so a prepare costs no API round trip. A pod the cache has
// not seen yet (the watch lags the binding by a few milliseconds) is read
// from the API server once.
type PodInformer struct {
	client  kubernetes.Interface
	lister  corelisters.PodLister
	synced  cache.InformerSynced
	factory informers.SharedInformerFactory
}

// NewPodInformer watches the pods bound to nodeName.
func NewPodInformer(client kubernetes.Interface, nodeName string) *PodInformer {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
		}))
	pods := factory.Core().V1().Pods()
	return &PodInformer{client: client, lister: pods.Lister(), synced: pods.Informer().HasSynced, factory: factory}
}

// Start runs the watch until ctx ends and waits for the first list.
func (p *PodInformer) Start(ctx context.Context) error {
	p.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), p.synced) {
		return fmt.Errorf("pod informer did not sync: %w", context.Cause(ctx))
	}
	return nil
}

// GetPod implements PodGetter: from the cache when it has the pod with
// uid, else (not seen yet, or an older pod of the same name) from the API.
func (p *PodInformer) GetPod(ctx context.Context, namespace, name string, uid types.UID) (*corev1.Pod, error) {
	pod, err := p.lister.Pods(namespace).Get(name)
	if err == nil && pod.UID == uid {
		return pod, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	return p.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}
