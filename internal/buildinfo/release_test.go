package buildinfo

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const repoRoot = "../.."

// TestChartCarriesTheVersion: the chart's version and appVersion (which is
// also the image's default tag) are the VERSION file's, so a chart, its
// image and its binaries always name one release.
func TestChartCarriesTheVersion(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSpace(string(b))
	// SemVer 2, which Helm requires of a chart version.
	if !regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?$`).MatchString(want) {
		t.Fatalf("VERSION holds %q, want a SemVer such as 0.2.0 or 0.3.0-dev", want)
	}
	chartPath := filepath.Join(repoRoot, "deployments", "helm", "rdma-dra-driver", "Chart.yaml")
	b, err = os.ReadFile(chartPath)
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatalf("%s: %v", chartPath, err)
	}
	if chart.Version != want || chart.AppVersion != want {
		t.Errorf("%s has version %q, appVersion %q; VERSION says %q: change them together", chartPath, chart.Version, chart.AppVersion, want)
	}
}

// TestChangelogNamesEveryRelease: every release heading of CHANGELOG.md
// names its commit in full, the form the upgrade test checks out with git
// worktree, and the first is 0.1.0 at the commit that started the file.
func TestChangelogNamesEveryRelease(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	rels, err := Releases(b)
	if err != nil {
		t.Fatal(err)
	}
	first := rels[len(rels)-1]
	if want := (Release{"0.1.0", "5658f81283cce31d189f481366f6817d641f6317"}); first != want {
		t.Errorf("oldest release = %+v, want %+v", first, want)
	}
}

func TestReleases(t *testing.T) {
	good := "# Changelog\n\n## Unreleased\n- x\n\n## 0.2.0 - 2027-01-01, commit " + strings.Repeat("b", 40) +
		"\n\n## 0.1.0 - 2026-12-03, commit " + strings.Repeat("a", 40) + "\n"
	rels, err := Releases([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	want := []Release{{"0.2.0", strings.Repeat("b", 40)}, {"0.1.0", strings.Repeat("a", 40)}}
	if !reflect.DeepEqual(rels, want) {
		t.Errorf("Releases = %+v, want %+v", rels, want)
	}
	for _, bad := range []string{"## Unreleased\n", "## 0.1.0 - commit 5658f81\n"} {
		if _, err := Releases([]byte(bad)); err == nil {
			t.Errorf("Releases(%q) succeeded", bad)
		}
	}
}
