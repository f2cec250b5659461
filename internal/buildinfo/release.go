package buildinfo

import (
	"fmt"
	"regexp"
)

// Release is one release as CHANGELOG.md records it.
type Release struct {
	Version string // 0.1.0
	Commit  string // the full hash of the release commit
}

var (
	releaseHeading = regexp.MustCompile(`(?m)^## (v?\d+\.\d+\.\d+\S*)(.*)$`)
	releaseCommit  = regexp.MustCompile(`\bcommit ([0-9a-f]{40})\b`)
)

// Releases reads CHANGELOG.md's release headings, newest first, such as
//
//	## 0.1.0 - 2026-12-03, commit 5658f81283cce31d189f481366f6817d641f6317
//
// Other headings ("## Unreleased") are not releases; a release heading
// without a full commit is an error naming it.
func Releases(changelog []byte) ([]Release, error) {
	var out []Release
	for _, m := range releaseHeading.FindAllSubmatch(changelog, -1) {
		c := releaseCommit.FindSubmatch(m[2])
		if c == nil {
			return nil, fmt.Errorf("CHANGELOG.md: release heading %q names no full commit (want \"commit <40 hex digits>\")", m[0])
		}
		out = append(out, Release{Version: string(m[1]), Commit: string(c[1])})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("CHANGELOG.md names no release")
	}
	return out, nil
}
