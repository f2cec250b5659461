package hcatest

import (
	"os"
	"path/filepath"
)

// writer writes sysfs files relative to root and keeps the first error.
type writer struct {
	root string
	dirs map[string]bool
	err  error
}

func newWriter(root string) *writer { return &writer{root: root, dirs: map[string]bool{}} }

func (w *writer) dir(rel string) {
	if w.err != nil || w.dirs[rel] {
		return
	}
	if err := os.MkdirAll(filepath.Join(w.root, rel), 0o755); err != nil {
		w.err = err
		return
	}
	for d := rel; d != "." && d != "/" && !w.dirs[d]; d = filepath.Dir(d) {
		w.dirs[d] = true
	}
}

// file writes content plus the newline sysfs ends every attribute with.
func (w *writer) file(rel, content string) {
	w.dir(filepath.Dir(rel))
	if w.err == nil {
		w.err = os.WriteFile(filepath.Join(w.root, rel), []byte(content+"\n"), 0o644)
	}
}

// raw writes content as is: a binary attribute (config, vpd).
func (w *writer) raw(rel string, content []byte) {
	w.dir(filepath.Dir(rel))
	if w.err == nil {
		w.err = os.WriteFile(filepath.Join(w.root, rel), content, 0o644)
	}
}

// empty writes an empty file: an attribute whose read fails.
func (w *writer) empty(rel string) {
	w.dir(filepath.Dir(rel))
	if w.err == nil {
		w.err = os.WriteFile(filepath.Join(w.root, rel), nil, 0o644)
	}
}

// link makes rel a relative symlink to target (both relative to root), as
// the kernel spells it: up to an ancestor of the target's parent, then down,
// so a link to an ancestor still names it (device -> ../../../0000:16:00.0).
func (w *writer) link(rel, target string) {
	dir := filepath.Dir(rel)
	w.dir(dir)
	if w.err != nil {
		return
	}
	up, err := filepath.Rel(dir, filepath.Dir(target))
	if err != nil {
		w.err = err
		return
	}
	w.err = os.Symlink(filepath.Join(up, filepath.Base(target)), filepath.Join(w.root, rel))
}
