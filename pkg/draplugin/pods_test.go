package draplugin

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// TestPodInformerLag: the cache still holds the old web-0 (a StatefulSet
// pod deleted and recreated under the same name) or none at all; GetPod
// then answers from the API server, and from the cache only on a UID match.
func TestPodInformerLag(t *testing.T) {
	pod := func(uid types.UID, hostNetwork bool) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", UID: uid}, Spec: corev1.PodSpec{HostNetwork: hostNetwork}}
	}
	tests := []struct {
		name      string
		cached    *corev1.Pod
		api       *corev1.Pod
		want      types.UID
		wantCache bool
	}{
		{name: "cache has it", cached: pod("new", true), api: pod("new", true), want: "new", wantCache: true},
		{name: "cache has the old pod", cached: pod("old", false), api: pod("new", true), want: "new"},
		{name: "cache has nothing yet", api: pod("new", true), want: "new"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			if tt.cached != nil {
				if err := idx.Add(tt.cached); err != nil {
					t.Fatal(err)
				}
			}
			client := fake.NewClientset(tt.api)
			p := &PodInformer{client: client, lister: corelisters.NewPodLister(idx)}
			got, err := p.GetPod(context.Background(), "default", "web-0", "new")
			if err != nil {
				t.Fatal(err)
			}
			if got.UID != tt.want {
				t.Errorf("GetPod returned UID %s, want %s", got.UID, tt.want)
			}
			gets := 0
			for _, a := range client.Actions() {
				if a.GetVerb() == "get" {
					gets++
				}
			}
			if tt.wantCache != (gets == 0) {
				t.Errorf("API GETs = %d, want cache hit %t", gets, tt.wantCache)
			}
		})
	}
}
