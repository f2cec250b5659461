package cluster

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// BuildDriver builds cmd/rdma-dra-driver into dir and returns its path, so
// the suite runs the driver as the real process it is on a node. The hook
// goes beside it (HookName): StartDriver names it, and runc runs it for
// the devices the driver hands out (the hostNetwork check).
func BuildDriver(dir string) (string, error) {
	out := filepath.Join(dir, "rdma-dra-driver")
	// Built in the main module, with its own go.sum and nothing of
	// k8s.io/kubernetes, exactly as it ships.
	for _, b := range [][2]string{{out, "./cmd/rdma-dra-driver"}, {filepath.Join(dir, HookName), "./cmd/rdma-dra-hook"}} {
		if err := goBuild(RepoRoot(), b[0], b[1]); err != nil {
			return "", err
		}
	}
	return out, nil
}

// goBuild builds pkg of the module in moduleDir into out.
func goBuild(moduleDir, out, pkg string) error {
	if o, err := exec.Command("go", "build", "-C", moduleDir, "-o", out, pkg).CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v\n%s", pkg, err, o)
	}
	return nil
}

// BuildTestCommand builds the test module's command cmd/<name> into dir
// and returns its path.
func BuildTestCommand(dir, name string) (string, error) {
	out := filepath.Join(dir, name)
	return out, goBuild(filepath.Join(RepoRoot(), "test"), out, "./cmd/"+name)
}

// HookName is rdma-dra-hook's file name beside the driver BuildDriver built.
const HookName = "rdma-dra-hook"

// RepoRoot is the main module's directory (this file is test/cluster/driver.go).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// DriverProcess is one run of the driver binary, or of another test
// process (StartProcess).
type DriverProcess struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{}
	err  error
}

// StartDriver starts the driver binary with args, and the hook beside it
// unless args name one; its output is kept for Logs.
func StartDriver(binary string, args ...string) (*DriverProcess, error) {
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--hook-path") }) {
		args = append(slices.Clone(args), "--hook-path="+filepath.Join(filepath.Dir(binary), HookName))
	}
	return StartProcess(binary, args...)
}

// StartProcess starts binary with args; its output is kept for Logs.
func StartProcess(binary string, args ...string) (*DriverProcess, error) {
	p := &DriverProcess{done: make(chan struct{})}
	p.cmd = exec.Command(binary, args...)
	p.cmd.Stdout, p.cmd.Stderr = (*lockedWriter)(p), (*lockedWriter)(p)
	p.cmd.Env = append(os.Environ(), "NODE_NAME=")
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

type lockedWriter DriverProcess

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.logs.Write(b)
}

// Logs returns what the driver printed so far.
func (p *DriverProcess) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// Kill sends SIGKILL and waits: nothing gets to clean up.
func (p *DriverProcess) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits for a clean exit.
func (p *DriverProcess) Stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
	return p.err
}

// Exited reports whether the process ended, and how.
func (p *DriverProcess) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}
