package hca

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
)

// pass is one discovery walk.
type pass struct {
	d       *Discoverer
	root    string // sysfs root, symlinks resolved
	ibClass dir    // class/infiniband
	buf     []byte // every file read of the pass lands here
	dents   []byte // directory entries
}

// dir is a directory a pass reads: on Linux fd is open and its files are
// opened relative to it (openat); fd is -1 when it is read by path.
type dir struct {
	fd   int
	path string // for messages, and reads by path
}

func (d dir) join(name string) string {
	if name == "" {
		return d.path
	}
	if d.path == "" {
		return name
	}
	return d.path + string(filepath.Separator) + name
}

type passBufs struct{ buf, dents []byte }

// bufPool keeps the buffers between passes: a rescan allocates none.
var bufPool = sync.Pool{New: func() any {
	return &passBufs{buf: make([]byte, 0, 4096), dents: make([]byte, 32<<10)}
}}

func newPass(d *Discoverer, root string) *pass {
	b := bufPool.Get().(*passBufs)
	return &pass{d: d, root: root, ibClass: dir{fd: -1}, buf: b.buf, dents: b.dents}
}

func (p *pass) done() {
	p.closeDir(p.ibClass)
	p.release()
}

func (p *pass) release() { bufPool.Put(&passBufs{buf: p.buf[:0], dents: p.dents}) }

// maxWorkers bounds the goroutines of one pass: sysfs reads are system
// calls, so more workers than CPUs only queue.
const maxWorkers = 4

// parallel runs f(i) for i in [0, n) on up to GOMAXPROCS workers, each
// with its own pass buffers. The HCAs of a node are independent.
func (p *pass) parallel(n int, f func(p *pass, i int)) {
	workers := min(runtime.GOMAXPROCS(0), maxWorkers, n)
	var next atomic.Int64
	work := func(sub *pass) {
		for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
			f(sub, i)
		}
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		sub := newPass(p.d, p.root)
		sub.ibClass = p.ibClass
		wg.Go(func() {
			defer sub.release()
			work(sub)
		})
	}
	work(p)
	wg.Wait()
}

// read returns a file's content without the trailing newline.
func (p *pass) read(path string) (string, error) {
	b, err := p.d.readFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// readAt is read for name in d.
func (p *pass) readAt(d dir, name string) (string, error) {
	b, err := p.readIn(d, name)
	if err != nil {
		return "", err
	}
	for len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	}
	return string(b), nil
}

// warner collects warnings that name the file.
type warner struct{ list *[]string }

func (w warner) add(path string, err error) { *w.list = append(*w.list, fileError(path, err)) }

// fileError is "<path>: <err>", without repeating the path a PathError
// already carries.
func fileError(path string, err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == path {
		err = pe.Err
	}
	return fmt.Sprintf("%s: %v", path, err)
}

// addErr records an error that already names its file.
func (w warner) addErr(err error) { *w.list = append(*w.list, err.Error()) }

// readAttr reads a required attribute, name in d; a failure is a warning.
func (p *pass) readAttr(w warner, d dir, name string) (string, bool) {
	s, err := p.readAt(d, name)
	if err != nil {
		w.add(d.join(name), err)
		return "", false
	}
	return s, true
}

// readOptional reads an attribute that some drivers lack: absence is silent.
func (p *pass) readOptional(w warner, d dir, name string) string {
	s, err := p.readAt(d, name)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		w.add(d.join(name), err)
	}
	return s
}

// dirNames lists a directory's names, unsorted (callers sort what they keep).
func dirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: err}
	}
	return names, nil
}
