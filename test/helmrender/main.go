// Command helmrender renders the rdma-dra-driver Helm chart with the Helm
// Go SDK, validating values against values.schema.json, and prints the
// manifests. It is its own module so Helm's dependencies never meet
// k8s.io/kubernetes in the e2e module, which applies what this prints.
//
//	helmrender --chart DIR --namespace NS --values '{"sharing":"shared"}'
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
)

func main() {
	chartDir := flag.String("chart", "", "chart directory")
	namespace := flag.String("namespace", "rdma-system", "release namespace")
	release := flag.String("release", "rdma", "release name")
	values := flag.String("values", "{}", "values as JSON")
	flag.Parse()
	out, err := render(*chartDir, *release, *namespace, *values)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helmrender:", err)
		os.Exit(1)
	}
	fmt.Print(out)
}

// render returns the chart's manifests, templates in name order, each
// document separated by "---".
func render(chartDir, release, namespace, valuesJSON string) (string, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return "", err
	}
	var vals map[string]any
	if err := json.Unmarshal([]byte(valuesJSON), &vals); err != nil {
		return "", fmt.Errorf("--values: %w", err)
	}
	top, err := chartutil.ToRenderValues(chrt, vals, common.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true}, nil)
	if err != nil {
		return "", err
	}
	files, err := engine.Render(chrt, top)
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
