package node

// The node's cgroups: the root the kubelet and containerd use, and their
// removal at Stop.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// cgroupMounts are the host's cgroup hierarchies (v1 controllers, the
// hybrid unified one, or the v2 root).
func cgroupMounts() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, " - ", 2)
		if len(parts) != 2 {
			continue
		}
		fields := strings.Fields(parts[0])
		fstype := strings.Fields(parts[1])
		if len(fields) < 5 || len(fstype) == 0 || (fstype[0] != "cgroup" && fstype[0] != "cgroup2") {
			continue
		}
		dirs = append(dirs, fields[4])
	}
	sort.Strings(dirs)
	return dirs, nil
}

// makeCgroupRoot creates the kubelet's cgroupRoot in every hierarchy (the
// kubelet requires it to exist); cpuset needs its cpus and mems set. On a
// cgroup v2 root nobody has delegated controllers on (a bare guest kernel,
// no systemd), it enables them first: the kubelet wants cpu, memory and
// pids under its root, and a claim's rdma.max needs rdma.
func (n *Node) makeCgroupRoot() error {
	dirs, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if err := enableControllers(d); err != nil {
			return fmt.Errorf("node cgroup root: %w", err)
		}
		dir := filepath.Join(d, n.cgroupRoot)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("node cgroup root: %w", err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("node cgroup root: %s: %w", filepath.Join(dir, f), err)
				}
			}
		}
	}
	return nil
}

// enableControllers writes every controller of a cgroup v2 root's
// cgroup.controllers into its cgroup.subtree_control (nothing to do on a
// v1 hierarchy, or where they are enabled already).
func enableControllers(root string) error {
	avail, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return nil // a v1 hierarchy
	}
	control := filepath.Join(root, "cgroup.subtree_control")
	on, err := os.ReadFile(control)
	if err != nil {
		return err
	}
	enabled := strings.Fields(string(on))
	for _, c := range strings.Fields(string(avail)) {
		if slices.Contains(enabled, c) {
			continue
		}
		if err := os.WriteFile(control, []byte("+"+c), 0o644); err != nil {
			return fmt.Errorf("enabling the %s controller in %s: %w", c, control, err)
		}
	}
	return nil
}

func (n *Node) cgroupPids() map[int]bool {
	pids := map[int]bool{}
	dirs, _ := cgroupMounts()
	for _, d := range dirs {
		_ = filepath.WalkDir(filepath.Join(d, n.cgroupRoot), func(path string, e os.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
					pids[pid] = true
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroups removes the node's cgroup root in every hierarchy,
// deepest first (a cgroup goes once its last task has exited).
func (n *Node) removeCgroups() error {
	dirs, err := cgroupMounts()
	if err != nil {
		return err
	}
	var left []string
	for _, d := range dirs {
		root := filepath.Join(d, n.cgroupRoot)
		var all []string
		_ = filepath.WalkDir(root, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, path)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- {
			err := poll.Until(context.Background(), "rmdir "+all[i], 20*time.Millisecond, time.Second, func(context.Context) (bool, string, error) {
				err := syscall.Rmdir(all[i])
				return err == nil || errors.Is(err, syscall.ENOENT), fmt.Sprint(err), nil
			})
			if err != nil {
				left = append(left, err.Error())
			}
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("cgroups not removed: %s", strings.Join(left, ", "))
	}
	return nil
}

// ControlPlaneOptions are what a control plane needs for a real node:
// service account tokens for pods (the driver's in-cluster client) and the
// kubelet dialed at its InternalIP (its Hostname, the node name, does not
// resolve). Run cluster.StartNodeControllers beside StartControllers.
