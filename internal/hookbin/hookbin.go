// Package hookbin names the rdma-dra-hook binaries installed on a node.
//
// CDI specs outlive the daemon that wrote them: a rolling upgrade or a
// rollback replaces the daemon while containers prepared by the previous
// one still start from their specs. A spec must therefore name a hook
// binary that understands every argument it was written with. The chart's
// init container installs each release's hook twice: under the plain name
// (for specs of releases before pinning) and under a name derived from its
// content, which is never overwritten; the daemon names the pinned one.
package hookbin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Name is the plain file name of the installed hook.
const Name = "rdma-dra-hook"

// Pinned is the file name of the hook binary with content b: the plain
// name, a dash and the first 16 hex digits of its SHA-256.
func Pinned(b []byte) string {
	sum := sha256.Sum256(b)
	return Name + "-" + hex.EncodeToString(sum[:8])
}

// IsPinned reports whether name has the form of a pinned hook's file name.
func IsPinned(name string) bool {
	digits, ok := strings.CutPrefix(name, Name+"-")
	if !ok || len(digits) != 16 {
		return false
	}
	_, err := hex.DecodeString(digits)
	return err == nil && strings.ToLower(digits) == digits
}

// PinnedPath is the pinned path, beside hookPath (the plain installed
// path the daemon was given), of the hook binary at source (the same
// binary in the daemon's own image, which the init container installed).
func PinnedPath(hookPath, source string) (string, error) {
	b, err := os.ReadFile(source)
	if err != nil {
		return "", fmt.Errorf("reading the hook binary to pin it: %w", err)
	}
	if len(b) == 0 {
		return "", fmt.Errorf("the hook binary %s is empty", source)
	}
	return filepath.Join(filepath.Dir(hookPath), Pinned(b)), nil
}
