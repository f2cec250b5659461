package cluster

import (
	"os"
	"path/filepath"
	"regexp"
	_ "unsafe" // go:linkname

	"k8s.io/component-base/version"
)

// The in-process kube-apiserver reports k8s.io/component-base's gitVersion,
// which only a release build sets (-ldflags -X); unset it is
// v0.0.0-master, and helm refuses to install a chart whose kubeVersion
// (>=1.34) that does not satisfy. Set it, as the release build of the
// k8s.io/kubernetes version this module builds would.
//
//go:linkname gitVersion k8s.io/component-base/version.gitVersion
var gitVersion string

const unsetGitVersion = "v0.0.0-master+$Format:%H$"

func init() {
	if gitVersion != unsetGitVersion {
		return // set by -ldflags
	}
	// A test binary records no dependencies (debug.ReadBuildInfo): read
	// the module's go.mod.
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "test", "go.mod"))
	if err != nil {
		return
	}
	if m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\d+\.\d+\.\d+)\s*$`).FindSubmatch(b); m != nil {
		// SetDynamicVersion takes only the build's version (or one of the
		// same major.minor.patch): set that first.
		gitVersion = string(m[1])
		_ = version.SetDynamicVersion(gitVersion)
	}
}
