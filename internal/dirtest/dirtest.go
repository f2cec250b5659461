// Package dirtest holds test helpers for code that must leave a directory
// exactly as it should be (no temp files left behind).
package dirtest

import (
	"os"
	"testing"
)

// Names lists the entries of dir, sorted by name; the test fails if dir
// cannot be read.
func Names(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
