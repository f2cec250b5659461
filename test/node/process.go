package node

// The node's processes: containerd and the kubelet, started, waited for and
// stopped, and the ways into them.

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// process is one component running in the node's namespaces.
type process struct {
	name    string
	cmd     *exec.Cmd
	log     string
	done    chan struct{}
	err     error
	stopped atomic.Bool // we ended it: not a crash
}

// spawn starts argv inside the node's namespaces (nsenter), its output to
// logs/<name>.log.
func (n *Node) spawn(name string, env []string, argv ...string) (*process, error) {
	logPath := n.path("logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	args := append([]string{"--target", strconv.Itoa(n.nsPid), "--mount", "--net", "--"}, argv...)
	cmd := exec.Command("nsenter", args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := startOnLiveThread(cmd); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	n.mu.Lock()
	n.procs[name] = p
	n.mu.Unlock()
	return p, nil
}

// exited returns an error naming the component and its last log lines if
// it has ended.
func (p *process) exited() error {
	select {
	case <-p.done:
		b, _ := os.ReadFile(p.log)
		return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.name, p.err, p.log, LastLines(string(b), 25))
	default:
		return nil
	}
}

// stop sends SIGTERM, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	p.stopped.Store(true)
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// StartContainerd starts containerd and waits until it answers.
func (n *Node) StartContainerd(ctx context.Context) error {
	// The shims inherit containerd's environment: ownerEnv lets a later
	// run find them if this process dies without its cleanups.
	env := []string{"PATH=" + filepath.Dir(n.Bin.Containerd) + ":" + os.Getenv("PATH"), ownerEnv + "=" + strconv.Itoa(os.Getpid())}
	p, err := n.spawn("containerd", env, n.Bin.Containerd, "--config", n.path("etc", "containerd.toml"), "--log-level", "info")
	if err != nil {
		return err
	}
	return n.waitFor(ctx, "containerd to answer", 60*time.Second, p, func() (bool, error) {
		_, err := n.Ctr(ctx, "version")
		return err == nil, nil
	})
}

// StopContainerd stops containerd (SIGTERM); pods keep running in their shims.
func (n *Node) StopContainerd() { n.stopProc("containerd", 10*time.Second) }

// StartKubelet starts the kubelet and waits until the Node is Ready.
func (n *Node) StartKubelet(ctx context.Context) error {
	p, err := n.spawn("kubelet", []string{ownerEnv + "=" + strconv.Itoa(os.Getpid())}, n.Bin.Kubelet,
		"--config="+n.path("etc", "kubelet.yaml"),
		"--kubeconfig="+n.path("etc", "kubeconfig"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.IP,
		"--cert-dir="+n.path("pki"),
		"--v=2")
	if err != nil {
		return err
	}
	// After a restart the Node is still Ready from the old kubelet: wait
	// for the new one's health endpoint, then for a Ready heartbeat of its own.
	started := metav1.NewTime(time.Now().Truncate(time.Second))
	return n.waitFor(ctx, "node "+n.Name+" to be Ready", 2*time.Minute, p, func() (bool, error) {
		if !n.kubeletHealthy() {
			return false, nil
		}
		node, err := n.cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue && !c.LastHeartbeatTime.Before(&started) {
				return true, nil
			}
		}
		return false, nil
	})
}

// kubeletHealthy asks the kubelet's healthz endpoint (127.0.0.1:10248 in
// the node's network namespace).
func (n *Node) kubeletHealthy() bool {
	c, err := n.netns.dial("127.0.0.1:10248")
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n"); err != nil {
		return false
	}
	b, _ := io.ReadAll(c)
	return strings.HasPrefix(string(b), "HTTP/1.0 200") || strings.HasPrefix(string(b), "HTTP/1.1 200")
}

// StopKubelet stops the kubelet (SIGTERM); pods keep running.
func (n *Node) StopKubelet() { n.stopProc("kubelet", 10*time.Second) }

func (n *Node) stopProc(name string, grace time.Duration) {
	n.mu.Lock()
	p := n.procs[name]
	n.mu.Unlock()
	if p != nil {
		p.stop(grace)
	}
}

// waitFor polls cond until it holds, p exits (an error with its last log
// lines), ctx ends or d passes.
func (n *Node) waitFor(ctx context.Context, what string, d time.Duration, p *process, cond func() (bool, error)) error {
	err := poll.Until(ctx, what, 100*time.Millisecond, d, func(context.Context) (bool, string, error) {
		if err := p.exited(); err != nil {
			return false, "", err
		}
		ok, err := cond()
		return ok, "", err
	})
	if err != nil && p.exited() == nil && ctx.Err() == nil {
		b, _ := os.ReadFile(p.log)
		return fmt.Errorf("%w; last lines of %s:\n%s", err, p.log, LastLines(string(b), 25))
	}
	return err
}

// Ctr runs ctr against the node's containerd in its k8s.io namespace.
func (n *Node) Ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.Bin.Ctr, append([]string{"--address", n.ContainerdSocket(), "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Dial connects, over TCP, to addr as seen from inside the node's network
// namespace (a pod's IP, a hostNetwork port); an http.Transport can use it
// as its DialContext.
func (n *Node) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if network != "tcp" && network != "tcp4" {
		return nil, fmt.Errorf("node %s: dial %s %s: only tcp", n.Name, network, addr)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return n.netns.dial(addr)
}

// ImportImage imports an OCI image tarball (and unpacks it for the CRI).
func (n *Node) ImportImage(ctx context.Context, tarball string) error {
	_, err := n.Ctr(ctx, "images", "import", tarball)
	return err
}

// Logs returns a component's log ("containerd", "kubelet").
func (n *Node) Logs(component string) string {
	b, _ := os.ReadFile(n.path("logs", component+".log"))
	return string(b)
}
