package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// ChartDir is the chart of this tree.
func ChartDir() string { return filepath.Join(RepoRoot(), "deployments", "helm", "rdma-dra-driver") }

// Helm is the real helm CLI (helm.sh/helm/v4/cmd/helm at the version
// test/helmrender's go.mod requires, built once and cached) pointed at a
// control plane by its kubeconfig. Releases are real: a release Secret per
// revision in the release's namespace, so list, status, upgrade, rollback
// and uninstall behave as they do for users.
type Helm struct {
	Bin        string
	Kubeconfig string
	home       string // HELM_{CACHE,CONFIG,DATA}_HOME: nothing of the user's is read or written
}

// NewHelm returns the helm CLI for cp; its own state goes under dir.
func NewHelm(cp *ControlPlane, dir string) (*Helm, error) {
	bin, err := HelmBinary()
	if err != nil {
		return nil, err
	}
	home := filepath.Join(dir, "helm-home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return nil, err
	}
	return &Helm{Bin: bin, Kubeconfig: cp.Kubeconfig, home: home}, nil
}

var helmBuild struct {
	sync.Mutex
	bin string
}

// HelmBinary builds helm from the module test/helmrender requires (its
// go.mod's tool line) into ${XDG_CACHE_HOME:-~/.cache}/rdma-dra-driver/helm,
// keyed by that module's go.mod and go.sum, and returns its path.
func HelmBinary() (string, error) {
	helmBuild.Lock()
	defer helmBuild.Unlock()
	if helmBuild.bin != "" {
		return helmBuild.bin, nil
	}
	mod := filepath.Join(RepoRoot(), "test", "helmrender")
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(mod, f))
		if err != nil {
			return "", fmt.Errorf("helm binary: %w", err)
		}
		h.Write(b)
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("helm binary cache: %w", err)
	}
	dir := filepath.Join(base, "rdma-dra-driver", "helm")
	bin := filepath.Join(dir, "helm-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(bin); err == nil {
		helmBuild.bin = bin
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("helm binary cache: %w", err)
	}
	// A temporary name renamed into place: a concurrent or killed build
	// never leaves a half-written binary under the final name.
	tmp := fmt.Sprintf("%s.tmp-%d", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, "helm.sh/helm/v4/cmd/helm")
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("building helm (go build helm.sh/helm/v4/cmd/helm in test/helmrender): %v\n%s", err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	helmBuild.bin = bin
	return bin, nil
}

// Run runs helm with args and returns its stdout; an error carries stderr.
func (h *Helm) Run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, h.Bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+h.Kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// valuesFile writes values (JSON, which is YAML) for -f.
func (h *Helm) valuesFile(release, valuesJSON string) (string, error) {
	if !json.Valid([]byte(valuesJSON)) {
		return "", fmt.Errorf("values for %s are not JSON: %s", release, valuesJSON)
	}
	f, err := os.CreateTemp(h.home, release+"-values-*.json")
	if err != nil {
		return "", err
	}
	defer f.Close()
	_, err = io.WriteString(f, valuesJSON)
	return f.Name(), err
}

// Install is `helm install release chart -n namespace --create-namespace
// -f values`; it does not wait for the pods (callers do, and say what for).
func (h *Helm) Install(ctx context.Context, release, namespace, chart, valuesJSON string) error {
	vf, err := h.valuesFile(release, valuesJSON)
	if err != nil {
		return err
	}
	_, err = h.Run(ctx, "install", release, chart, "--namespace", namespace, "--create-namespace", "--values", vf)
	return err
}

// Upgrade is `helm upgrade release chart -n namespace -f values`: the
// values replace the release's (no --reuse-values), as a user's file does.
func (h *Helm) Upgrade(ctx context.Context, release, namespace, chart, valuesJSON string) error {
	vf, err := h.valuesFile(release, valuesJSON)
	if err != nil {
		return err
	}
	_, err = h.Run(ctx, "upgrade", release, chart, "--namespace", namespace, "--values", vf)
	return err
}

// Rollback is `helm rollback release revision -n namespace`.
func (h *Helm) Rollback(ctx context.Context, release, namespace string, revision int) error {
	_, err := h.Run(ctx, "rollback", release, strconv.Itoa(revision), "--namespace", namespace)
	return err
}

// Uninstall is `helm uninstall release -n namespace`.
func (h *Helm) Uninstall(ctx context.Context, release, namespace string) error {
	_, err := h.Run(ctx, "uninstall", release, "--namespace", namespace)
	return err
}

// HelmRelease is a row of `helm list -o json`.
type HelmRelease struct {
	Name       string `json:"name"`
	Namespace  string `json:"namespace"`
	Revision   string `json:"revision"`
	Status     string `json:"status"`
	Chart      string `json:"chart"`
	AppVersion string `json:"app_version"`
}

// List is `helm list -n namespace -o json`.
func (h *Helm) List(ctx context.Context, namespace string) ([]HelmRelease, error) {
	out, err := h.Run(ctx, "list", "--namespace", namespace, "--output", "json")
	if err != nil {
		return nil, err
	}
	var rels []HelmRelease
	if err := json.Unmarshal([]byte(out), &rels); err != nil {
		return nil, fmt.Errorf("helm list -o json: %v: %q", err, out)
	}
	return rels, nil
}

// Manifest is `helm get manifest`, parsed: the release's objects in the
// chart's order, each annotated with its release as Helm annotates the
// live object (meta.helm.sh/release-name and -namespace).
func (h *Helm) Manifest(ctx context.Context, release, namespace string) ([]*unstructured.Unstructured, error) {
	out, err := h.Run(ctx, "get", "manifest", release, "--namespace", namespace)
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("helm get manifest %s: %w", release, err)
		}
		if len(m) == 0 {
			continue
		}
		o := &unstructured.Unstructured{Object: m}
		ann := o.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[releaseNameAnnotation], ann[releaseNamespaceAnnotation] = release, namespace
		o.SetAnnotations(ann)
		objs = append(objs, o)
	}
	return objs, nil
}

const (
	releaseNameAnnotation      = "meta.helm.sh/release-name"
	releaseNamespaceAnnotation = "meta.helm.sh/release-namespace"
)

// InstallChart installs this tree's deployments/helm/rdma-dra-driver with
// the real helm CLI (Helm's own install action: a release Secret, so helm
// list, status, upgrade, rollback and uninstall work), creating the
// namespace, and returns the release's objects (helm get manifest). dir
// holds helm's own state.
func InstallChart(ctx context.Context, cp *ControlPlane, dir, release, namespace, valuesJSON string) ([]*unstructured.Unstructured, error) {
	h, err := NewHelm(cp, dir)
	if err != nil {
		return nil, err
	}
	if err := h.Install(ctx, release, namespace, ChartDir(), valuesJSON); err != nil {
		return nil, err
	}
	return h.Manifest(ctx, release, namespace)
}

// UninstallChart is `helm uninstall` of the release InstallChart returned
// objs for. Pods of the deleted DaemonSet go through the garbage
// collector, so callers wait for them.
func UninstallChart(ctx context.Context, cp *ControlPlane, objs []*unstructured.Unstructured) error {
	if len(objs) == 0 {
		return errors.New("uninstall: no objects, so no release")
	}
	ann := objs[0].GetAnnotations()
	release, namespace := ann[releaseNameAnnotation], ann[releaseNamespaceAnnotation]
	if release == "" {
		return fmt.Errorf("uninstall: %s %s carries no %s annotation", objs[0].GetKind(), objs[0].GetName(), releaseNameAnnotation)
	}
	dir, err := os.MkdirTemp("", "helm-uninstall-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	h, err := NewHelm(cp, dir)
	if err != nil {
		return err
	}
	return h.Uninstall(ctx, release, namespace)
}

// Remaining lists which of a release's objects (from Manifest) still exist
// in the API server, as "Kind name".
func Remaining(ctx context.Context, cp *ControlPlane, objs []*unstructured.Unstructured) ([]string, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	var left []string
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := o.GetNamespace()
			if ns == "" {
				ns = o.GetAnnotations()[releaseNamespaceAnnotation]
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		_, err = ri.Get(ctx, o.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
		default:
			left = append(left, gvk.Kind+" "+o.GetName())
		}
	}
	return left, nil
}
