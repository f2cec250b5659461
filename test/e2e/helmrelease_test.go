package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

// TestHelmRelease: the chart installed by the real helm CLI (built from
// helm.sh/helm/v4) against the real API server is a Helm release as users
// know it: helm list shows it after install, the new revision after an
// upgrade and the old values back after a rollback (a third revision);
// helm status and history agree; the release Secrets exist; and helm
// uninstall removes every object of the chart, cluster-scoped ones too.
func TestHelmRelease(t *testing.T) {
	t.Parallel() // no node: see parallel in main_test.go
	dir := t.TempDir()
	cp, err := cluster.StartControlPlane(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	ctx := context.Background()
	h, err := cluster.NewHelm(cp, dir)
	if err != nil {
		t.Fatal(err)
	}
	const release, ns = "rdma", "rdma-system"
	chartVersion := chartField(t, "version")
	appVersion := chartField(t, "appVersion")

	wantList := func(revision string) {
		t.Helper()
		rels, err := h.List(ctx, ns)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("helm list: %+v", rels)
		if len(rels) != 1 || rels[0].Name != release || rels[0].Revision != revision || rels[0].Status != "deployed" ||
			rels[0].Chart != "rdma-dra-driver-"+chartVersion || rels[0].AppVersion != appVersion {
			t.Fatalf("helm list = %+v, want %s revision %s deployed, chart rdma-dra-driver-%s, app version %s", rels, release, revision, chartVersion, appVersion)
		}
	}
	// sharing is the DaemonSet's --sharing argument.
	sharing := func() string {
		t.Helper()
		ds, err := cp.Client.AppsV1().DaemonSets(ns).Get(ctx, release+"-node", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
			if v, ok := strings.CutPrefix(a, "--sharing="); ok {
				return v
			}
		}
		t.Fatalf("no --sharing in %v", ds.Spec.Template.Spec.Containers[0].Args)
		return ""
	}

	if err := h.Install(ctx, release, ns, cluster.ChartDir(), `{"sharing":"exclusive"}`); err != nil {
		t.Fatal(err)
	}
	wantList("1")
	objs, err := h.Manifest(ctx, release, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) < 10 {
		t.Fatalf("helm get manifest: %d objects", len(objs))
	}
	if s := sharing(); s != "exclusive" {
		t.Errorf("after install --sharing=%s, want exclusive", s)
	}
	secrets, err := cp.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=" + release})
	if err != nil {
		t.Fatal(err)
	}
	if len(secrets.Items) != 1 || secrets.Items[0].Name != "sh.helm.release.v1."+release+".v1" {
		t.Errorf("release Secrets %d, want sh.helm.release.v1.%s.v1", len(secrets.Items), release)
	}

	if err := h.Upgrade(ctx, release, ns, cluster.ChartDir(), `{"sharing":"shared"}`); err != nil {
		t.Fatal(err)
	}
	wantList("2")
	if s := sharing(); s != "shared" {
		t.Errorf("after upgrade --sharing=%s, want shared", s)
	}

	if err := h.Rollback(ctx, release, ns, 1); err != nil {
		t.Fatal(err)
	}
	wantList("3")
	if s := sharing(); s != "exclusive" {
		t.Errorf("after rollback to 1 --sharing=%s, want exclusive", s)
	}
	out, err := h.Run(ctx, "history", release, "--namespace", ns, "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var history []struct {
		Revision    int    `json:"revision"`
		Status      string `json:"status"`
		Description string `json:"description"`
	}
	if err := json.Unmarshal([]byte(out), &history); err != nil {
		t.Fatalf("helm history: %v: %s", err, out)
	}
	t.Logf("helm history: %+v", history)
	if len(history) != 3 || history[0].Status != "superseded" || history[1].Status != "superseded" ||
		history[2].Status != "deployed" || history[2].Description != "Rollback to 1" {
		t.Errorf("helm history = %+v, want 1 and 2 superseded, 3 deployed by \"Rollback to 1\"", history)
	}
	status, err := h.Run(ctx, "status", release, "--namespace", ns)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^STATUS: deployed$`).MatchString(status) || !regexp.MustCompile(`(?m)^REVISION: 3$`).MatchString(status) {
		t.Errorf("helm status:\n%s\nwant STATUS: deployed, REVISION: 3", status)
	}

	if err := h.Uninstall(ctx, release, ns); err != nil {
		t.Fatal(err)
	}
	if rels, err := h.List(ctx, ns); err != nil || len(rels) != 0 {
		t.Errorf("helm list after uninstall: %+v, %v; want none", rels, err)
	}
	left, err := cluster.Remaining(ctx, cp, objs)
	if err != nil {
		t.Fatal(err)
	}
	if secrets, err := cp.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm"}); err != nil || len(secrets.Items) > 0 {
		left = append(left, fmt.Sprintf("release Secrets %d (%v)", len(secrets.Items), err))
	}
	if len(left) > 0 {
		t.Errorf("left after helm uninstall: %v", left)
	}
}

// chartField reads a top-level field of this tree's Chart.yaml.
func chartField(t *testing.T, field string) string {
	t.Helper()
	b, err := os.ReadFile(cluster.ChartDir() + "/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + field + `:\s*"?([^"\s]+)"?\s*$`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("Chart.yaml has no %s", field)
	}
	return m[1]
}
