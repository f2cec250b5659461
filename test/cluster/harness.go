package cluster

import (
	"fmt"
	"io"
	"os"
	"sync"
)

// Harness is a TB for commands (make demo, a cluster for kubectl): logs go
// to Out, a fatal error ends the process after running the cleanups.
type Harness struct {
	Out  io.Writer
	Dir  string // for TempDir
	mu   sync.Mutex
	done []func()
	fail bool
	n    int
}

// NewHarness logs to out (io.Discard for quiet) and makes temp dirs in dir.
func NewHarness(out io.Writer, dir string) *Harness { return &Harness{Out: out, Dir: dir} }

// Close runs the cleanups, last registered first.
func (h *Harness) Close() {
	h.mu.Lock()
	done := h.done
	h.done = nil
	h.mu.Unlock()
	for i := len(done) - 1; i >= 0; i-- {
		done[i]()
	}
}

func (h *Harness) Attr(key, value string)    {}
func (h *Harness) Chdir(dir string)          { _ = os.Chdir(dir) }
func (h *Harness) Cleanup(f func())          { h.mu.Lock(); h.done = append(h.done, f); h.mu.Unlock() }
func (h *Harness) Error(args ...any)         { h.Log(args...); h.Fail() }
func (h *Harness) Errorf(f string, a ...any) { h.Logf(f, a...); h.Fail() }
func (h *Harness) Fail()                     { h.mu.Lock(); h.fail = true; h.mu.Unlock() }
func (h *Harness) FailNow()                  { h.Close(); os.Exit(1) }
func (h *Harness) Failed() bool              { h.mu.Lock(); defer h.mu.Unlock(); return h.fail }
func (h *Harness) Fatal(args ...any)         { h.Log(args...); h.FailNow() }
func (h *Harness) Fatalf(f string, a ...any) { h.Logf(f, a...); h.FailNow() }
func (h *Harness) Helper()                   {}
func (h *Harness) Log(args ...any)           { fmt.Fprintln(h.Out, args...) }
func (h *Harness) Logf(f string, a ...any)   { fmt.Fprintf(h.Out, f+"\n", a...) }
func (h *Harness) Name() string              { return "rdma-dra-cluster" }
func (h *Harness) Setenv(key, value string)  { _ = os.Setenv(key, value) }
func (h *Harness) Skip(args ...any)          { h.Log(args...); h.SkipNow() }
func (h *Harness) Skipf(f string, a ...any)  { h.Logf(f, a...); h.SkipNow() }
func (h *Harness) SkipNow()                  { h.FailNow() }
func (h *Harness) Skipped() bool             { return false }

// TempDir makes a new directory under Dir.
func (h *Harness) TempDir() string {
	h.mu.Lock()
	h.n++
	n := h.n
	h.mu.Unlock()
	dir := fmt.Sprintf("%s/tmp%03d", h.Dir, n)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.Fatal(err)
	}
	return dir
}
