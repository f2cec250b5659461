// Package buildinfo is what a binary says about its build: the release
// version, the commit and the Go version. The Makefile sets version and
// commit with -ldflags -X (see ldflags there); a plain `go build` gets the
// commit from the VCS stamp the go command records.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time:
//
//	-X github.com/rdma-dra/rdma-dra-driver/internal/buildinfo.version=0.2.0
//	-X github.com/rdma-dra/rdma-dra-driver/internal/buildinfo.commit=<sha>[-dirty]
var (
	version string
	commit  string
)

// Unknown stands for a value neither the linker nor the build info gave.
const Unknown = "unknown"

// Info describes one build.
type Info struct {
	Version   string // the VERSION file's content at build time, e.g. 0.2.0
	Commit    string // the full commit hash, "-dirty" appended for a modified tree
	GoVersion string // runtime.Version()
}

// Get returns this binary's build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, commit, bi)
}

// resolve fills what the linker did not set from the build info: a module
// version for `go install ...@v0.2.0`, the VCS stamp for `go build` in a
// clone.
func resolve(version, commit string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version()}
	if bi == nil {
		bi = &debug.BuildInfo{}
	}
	if info.Version == "" {
		info.Version = Unknown
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			info.Version = v
		}
	}
	if info.Commit == "" {
		info.Commit = Unknown
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			info.Commit = rev
			if modified == "true" {
				info.Commit += "-dirty"
			}
		}
	}
	return info
}

// String is the line --version prints: "<program> <version> (commit <c>, <go>)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s)", i.Version, i.Commit, i.GoVersion)
}
