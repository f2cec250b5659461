package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// Reboot does to the node what a reboot does to what the kubelet and the
// driver keep: the kubelet and containerd stop, every process of the node
// dies (pods, shims, the driver), and the tmpfs CDI dir (run/cdi) is
// emptied, while /var/lib/kubelet (the kubelet's DRA state, the driver's
// checkpoint) stays. Between the stop and the start, newBoot does what the
// new boot changes (the test's boot ID file). The kubelet then finds every
// pod still bound to the node without a sandbox.
func (n *Node) Reboot(ctx context.Context, newBoot func() error) error {
	n.StopKubelet()
	n.StopContainerd()
	if err := n.killAll(); err != nil {
		return fmt.Errorf("reboot: %w", err)
	}
	cdiDir := n.path("run", "cdi")
	entries, err := os.ReadDir(cdiDir)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("reboot: %w", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(cdiDir, e.Name())); err != nil {
			return fmt.Errorf("reboot: %w", err)
		}
	}
	if newBoot != nil {
		if err := newBoot(); err != nil {
			return fmt.Errorf("reboot: %w", err)
		}
	}
	if err := n.StartContainerd(ctx); err != nil {
		return fmt.Errorf("reboot: %w", err)
	}
	if err := n.StartKubelet(ctx); err != nil {
		return fmt.Errorf("reboot: %w", err)
	}
	return nil
}
