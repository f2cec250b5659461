// Package hcatest writes a simulated RDMA node under a directory: the sysfs
// tree and the /dev/infiniband nodes, laid out exactly as the Linux kernel
// lays them out (docs/sysfs-layout.md is the contract). Discovery tests and
// the demo run against it instead of real hardware.
//
// The builder knows the layout only; it shares no code with discovery, so a
// misreading of the kernel in one cannot hide the same misreading in the
// other.
package hcatest

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Node is a simulated node written on disk.
type Node struct {
	Root      string // the directory passed to Build, made absolute
	SysfsRoot string // Root/sys
	DevRoot   string // Root/dev
	// Spec as written, defaults filled in; mutations keep it in step.
	Spec Spec
	// Faults maps absolute file paths (under SysfsRoot, symlinks not
	// resolved) to the errno a real kernel returns when reading them
	// (gid_attrs/ndevs/N on InfiniBand ports and on empty slots,
	// gid_attrs/types/N on empty slots: EINVAL). The files exist on disk
	// (empty), as the kernel lists them. Tests may add their own.
	Faults map[string]syscall.Errno
	// CharDevices is true when the /dev nodes are real character devices
	// (Build ran as root); otherwise they are empty regular files.
	CharDevices bool

	realSys string         // SysfsRoot with symlinks resolved, to match Faults
	ifindex map[string]int // netdev name => ifindex
}

// Build writes spec under dir (created if missing) as dir/sys and dir/dev.
// dir/sys must not exist yet. Device nodes are real character devices when
// running as root, empty files otherwise.
func Build(dir string, spec Spec) (*Node, error) {
	return build(dir, spec, os.Geteuid() == 0)
}

func build(dir string, spec Spec, mknod bool) (*Node, error) {
	spec = withDefaults(cloneSpec(spec))
	if err := validate(spec); err != nil {
		return nil, err
	}
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("hcatest: %w", err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("hcatest: %w", err)
	}
	n := &Node{
		Root:        root,
		SysfsRoot:   filepath.Join(root, "sys"),
		DevRoot:     filepath.Join(root, "dev"),
		Spec:        spec,
		Faults:      map[string]syscall.Errno{},
		CharDevices: mknod,
		ifindex:     map[string]int{},
	}
	if _, err := os.Lstat(n.SysfsRoot); err == nil {
		return nil, fmt.Errorf("hcatest: %s already exists", n.SysfsRoot)
	}
	b := &builder{n: n, w: newWriter(n.SysfsRoot), ifindex: 1}
	if err := b.build(); err != nil {
		return nil, fmt.Errorf("hcatest: %w", err)
	}
	if n.realSys, err = filepath.EvalSymlinks(n.SysfsRoot); err != nil {
		return nil, fmt.Errorf("hcatest: %w", err)
	}
	return n, nil
}
