// Command helmrender renders the rdma-dra-driver Helm chart with the Helm
// Go SDK, validating values against values.schema.json, and prints the
// manifests. It is its own module so Helm's dependencies never meet
// k8s.io/kubernetes in the e2e module, which dry-runs what this prints.
// The module also pins the helm CLI (its go.mod's tool line): the suite
// installs, upgrades, rolls back and uninstalls the chart with that binary
// (test/cluster's Helm), so releases are real Helm releases.
//
//	helmrender --chart DIR --namespace NS --values '{"sharing":"shared"}'
//
// With --install-order the manifests come in the order `helm install`
// creates them (Helm's own sorter: ServiceAccounts and RBAC before the
// DaemonSet), so applying them one by one is what an install does.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
)

func main() {
	chartDir := flag.String("chart", "", "chart directory")
	namespace := flag.String("namespace", "rdma-system", "release namespace")
	release := flag.String("release", "rdma", "release name")
	values := flag.String("values", "{}", "values as JSON")
	installOrder := flag.Bool("install-order", false, "print the manifests in Helm's install order")
	kubeVersion := flag.String("kube-version", "", "the cluster's Kubernetes version (.Capabilities.KubeVersion); empty is Helm's default, the client-go version it was built with")
	flag.Parse()
	render := renderAt
	if *installOrder {
		render = renderInstallOrderAt
	}
	out, err := render(*kubeVersion, *chartDir, *release, *namespace, *values)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helmrender:", err)
		os.Exit(1)
	}
	fmt.Print(out)
}

// render returns the chart's manifests, templates in name order, each
// document separated by "---", for Helm's default Kubernetes version.
func render(chartDir, release, namespace, valuesJSON string) (string, error) {
	return renderAt("", chartDir, release, namespace, valuesJSON)
}

// renderAt is render for Kubernetes kubeVersion ("" is Helm's default, the
// client-go version it was built with).
func renderAt(kubeVersion, chartDir, release, namespace, valuesJSON string) (string, error) {
	files, err := renderFiles(kubeVersion, chartDir, release, namespace, valuesJSON)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		if strings.HasSuffix(name, ".yaml") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		if body := strings.TrimSpace(files[name]); body != "" {
			fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", name, body)
		}
	}
	return b.String(), nil
}

// renderInstallOrderAt returns the manifests sorted as `helm install`
// applies them (releaseutil.InstallOrder); the chart has no hooks.
func renderInstallOrderAt(kubeVersion, chartDir, release, namespace, valuesJSON string) (string, error) {
	files, err := renderFiles(kubeVersion, chartDir, release, namespace, valuesJSON)
	if err != nil {
		return "", err
	}
	for name := range files {
		if !strings.HasSuffix(name, ".yaml") {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return "", err
	}
	if len(hooks) > 0 {
		return "", fmt.Errorf("the chart has %d hooks; helmrender does not run hooks", len(hooks))
	}
	var b strings.Builder
	for _, m := range manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.Name, strings.TrimSpace(m.Content))
	}
	return b.String(), nil
}

// renderFiles renders every template with the values (validated against
// the chart's schema) as Helm would for a cluster of kubeVersion.
func renderFiles(kubeVersion, chartDir, release, namespace, valuesJSON string) (map[string]string, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	var vals map[string]any
	if err := json.Unmarshal([]byte(valuesJSON), &vals); err != nil {
		return nil, fmt.Errorf("--values: %w", err)
	}
	caps := common.DefaultCapabilities.Copy()
	if kubeVersion != "" {
		kv, err := common.ParseKubeVersion(kubeVersion)
		if err != nil {
			return nil, fmt.Errorf("--kube-version: %w", err)
		}
		caps.KubeVersion = *kv
	}
	top, err := chartutil.ToRenderValues(chrt, vals, common.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(chrt, top)
}
