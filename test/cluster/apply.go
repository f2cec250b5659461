package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// ApplyFiles creates every object of the YAML files, in order. With dryRun
// the API server validates and admits them (CEL selectors compile,
// policies run) but stores nothing.
func ApplyFiles(ctx context.Context, cfg *rest.Config, dryRun bool, files ...string) ([]*unstructured.Unstructured, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	opts := metav1.CreateOptions{FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var created []*unstructured.Unstructured
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			return created, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for i := 0; ; i++ {
			obj := &unstructured.Unstructured{}
			if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return created, fmt.Errorf("%s, document %d: %w", file, i, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			gvk := obj.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				return created, fmt.Errorf("%s, document %d (%s): %w", file, i, gvk, err)
			}
			var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if obj.GetNamespace() != "" {
				ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
			}
			out, err := ri.Create(ctx, obj, opts)
			if err != nil {
				return created, fmt.Errorf("%s, %s %s: %w", file, gvk.Kind, obj.GetName(), err)
			}
			created = append(created, out)
		}
	}
	return created, nil
}
