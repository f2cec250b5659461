package node

import (
	"fmt"
	"syscall"
	"time"
)

// Kill SIGKILLs a component ("kubelet" or "containerd") as a crash would,
// with no chance to clean up, and waits for it to be gone. Pods keep
// running in their shims; StartKubelet or StartContainerd brings it back,
// as a service manager would.
func (n *Node) Kill(component string) error {
	n.mu.Lock()
	p := n.procs[component]
	n.mu.Unlock()
	if p == nil {
		return fmt.Errorf("node %s: no %s to kill", n.Name, component)
	}
	p.stopped.Store(true) // ended by us: not a crash for Stop to report
	select {
	case <-p.done:
		return fmt.Errorf("node %s: %s had already exited: %v", n.Name, component, p.err)
	default:
	}
	// nsenter execs the component: its pid is the component's.
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("node %s: kill -9 %s: %w", n.Name, component, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("node %s: %s still running 30s after SIGKILL", n.Name, component)
	}
}
