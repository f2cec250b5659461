package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// InstallChart installs deployments/helm/rdma-dra-driver as `helm install`
// would: rendered with the Helm Go SDK (test/helmrender, its own module,
// values validated against the chart's schema), objects created in Helm's
// install order, the namespace created first. Manifests go to dir.
func InstallChart(ctx context.Context, cp *ControlPlane, dir, release, namespace, valuesJSON string) ([]*unstructured.Unstructured, error) {
	root := RepoRoot()
	cmd := exec.CommandContext(ctx, "go", "run", ".", "--install-order",
		"--chart", filepath.Join(root, "deployments", "helm", "rdma-dra-driver"),
		"--release", release, "--namespace", namespace, "--values", valuesJSON)
	cmd.Dir = filepath.Join(root, "test", "helmrender")
	var stderr []byte
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = ee.Stderr
	}
	if err != nil {
		return nil, fmt.Errorf("rendering the chart (test/helmrender): %v: %s", err, stderr)
	}
	file := filepath.Join(dir, release+"-manifests.yaml")
	if err := os.WriteFile(file, out, 0o644); err != nil {
		return nil, err
	}
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("namespace %s: %w", namespace, err)
	}
	return ApplyFiles(ctx, cp.Config, false, file)
}

// UninstallChart deletes what InstallChart created, last first (helm
// uninstall); objects already gone are skipped. Pods of a deleted
// DaemonSet go through the garbage collector, so callers wait for them.
func UninstallChart(ctx context.Context, cp *ControlPlane, objs []*unstructured.Unstructured) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cp.Config)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	background := metav1.DeletePropagationBackground
	for i := len(objs) - 1; i >= 0; i-- {
		o := objs[i]
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("uninstall: %s %s: %w", gvk.Kind, o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if o.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{PropagationPolicy: &background}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("uninstall: %s %s: %w", gvk.Kind, o.GetName(), err)
		}
	}
	return nil
}
