package vm

// A writer of cpio "newc" archives, the format the kernel unpacks as an
// initramfs (Documentation/driver-api/early-userspace/buffer-format.rst).

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"
)

// Tree is the initramfs's content by path (no leading slash). Parent
// directories are added when written.
type Tree struct {
	entries map[string]entry
}

type entry struct {
	mode   fs.FileMode // type bits and permissions
	data   []byte      // regular file content, or nil to read src
	src    string      // host file to copy
	target string      // symlink target
}

// NewTree returns an empty tree.
func NewTree() *Tree { return &Tree{entries: map[string]entry{}} }

func clean(p string) string { return strings.Trim(p, "/") }

// Dir adds a directory.
func (t *Tree) Dir(p string, perm fs.FileMode) { t.entries[clean(p)] = entry{mode: fs.ModeDir | perm} }

// File adds a regular file with content.
func (t *Tree) File(p string, perm fs.FileMode, data []byte) {
	t.entries[clean(p)] = entry{mode: perm, data: data}
}

// Copy adds the host file src at p (read when the archive is written).
func (t *Tree) Copy(p, src string, perm fs.FileMode) {
	t.entries[clean(p)] = entry{mode: perm, src: src}
}

// Symlink adds a symbolic link.
func (t *Tree) Symlink(p, target string) {
	t.entries[clean(p)] = entry{mode: fs.ModeSymlink | 0o777, target: target}
}

// Has reports whether p is in the tree.
func (t *Tree) Has(p string) bool { _, ok := t.entries[clean(p)]; return ok }

// WriteTo writes the tree as a newc archive, parents before children.
func (t *Tree) WriteTo(w io.Writer) (int64, error) {
	all := map[string]entry{}
	for p, e := range t.entries {
		all[p] = e
		for d := p; strings.Contains(d, "/"); {
			d = d[:strings.LastIndex(d, "/")]
			if _, ok := all[d]; !ok {
				if _, own := t.entries[d]; !own {
					all[d] = entry{mode: fs.ModeDir | 0o755}
				}
			}
		}
	}
	names := make([]string, 0, len(all))
	for p := range all {
		if p != "" {
			names = append(names, p)
		}
	}
	sort.Strings(names)
	cw := &countWriter{w: bufio.NewWriterSize(w, 1<<20)}
	for i, p := range names {
		e := all[p]
		data := e.data
		switch {
		case e.mode&fs.ModeSymlink != 0:
			data = []byte(e.target)
		case e.src != "":
			b, err := os.ReadFile(e.src)
			if err != nil {
				return cw.n, fmt.Errorf("initramfs file %s: %w", p, err)
			}
			data = b
		}
		if err := writeHeader(cw, uint32(i+1), cpioMode(e.mode), p, len(data)); err != nil {
			return cw.n, err
		}
		if _, err := cw.Write(data); err != nil {
			return cw.n, err
		}
		if err := pad4(cw); err != nil {
			return cw.n, err
		}
	}
	if err := writeHeader(cw, 0, 0, "TRAILER!!!", 0); err != nil {
		return cw.n, err
	}
	return cw.n, cw.w.(*bufio.Writer).Flush()
}

// cpioMode turns Go's mode into the stat(2) st_mode the archive carries.
func cpioMode(m fs.FileMode) uint32 {
	perm := uint32(m.Perm())
	switch {
	case m.IsDir():
		return 0o040000 | perm
	case m&fs.ModeSymlink != 0:
		return 0o120000 | perm
	}
	return 0o100000 | perm
}

func writeHeader(w *countWriter, ino, mode uint32, name string, size int) error {
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize (with NUL), check.
	if _, err := fmt.Fprintf(w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name)+1, 0); err != nil {
		return err
	}
	if _, err := io.WriteString(w, name+"\x00"); err != nil {
		return err
	}
	return pad4(w)
}

func pad4(w *countWriter) error {
	if r := w.n % 4; r != 0 {
		_, err := w.Write(make([]byte, 4-r))
		return err
	}
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
