//go:build linux

package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// hostNetns is the kernel: RDMA netlink and rtnetlink sockets in the
// hook's namespace (the host's) or, opened on a thread that entered it,
// in the container's.
type hostNetns struct {
	ns *os.File // the container's /proc/PID/ns/net
}

func openHostNetns(pid int) (netnsKernel, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, err
	}
	return &hostNetns{ns: f}, nil
}

func (h *hostNetns) close() error { return h.ns.Close() }

func (h *hostNetns) sameNetns() (bool, error) {
	var self, ctr unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		return false, fmt.Errorf("the hook's own network namespace: %w", err)
	}
	if err := unix.Fstat(int(h.ns.Fd()), &ctr); err != nil {
		return false, fmt.Errorf("the container's network namespace: %w", err)
	}
	return self.Dev == ctr.Dev && self.Ino == ctr.Ino, nil
}

// dial opens a socket in the namespace of s. A netlink socket stays in the
// namespace it was created in, so only its creation needs the thread.
func dial[T any](h *hostNetns, s side, open func() (T, error)) (T, error) {
	if s == host {
		return open()
	}
	var zero T
	runtime.LockOSThread()
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return zero, err
	}
	defer orig.Close()
	if err := unix.Setns(int(h.ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return zero, fmt.Errorf("entering the container's network namespace: %w", err)
	}
	c, openErr := open()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked and dies with its goroutine's end: it
		// must never run anything else in the wrong namespace.
		return zero, fmt.Errorf("leaving the container's network namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return c, openErr
}

func (h *hostNetns) rdmaDevice(s side, name string) (rdmanl.Device, bool, error) {
	c, err := dial(h, s, rdmanl.Dial)
	if err != nil {
		return rdmanl.Device{}, false, err
	}
	defer c.Close()
	return c.Device(name)
}

func (h *hostNetns) moveRDMA(dev rdmanl.Device) error {
	c, err := rdmanl.Dial()
	if err != nil {
		return err
	}
	defer c.Close()
	return c.MoveToNetns(dev, int(h.ns.Fd()))
}

func (h *hostNetns) ports(s side, dev rdmanl.Device) ([]rdmanl.Port, error) {
	c, err := dial(h, s, rdmanl.Dial)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Ports(dev)
}

func (h *hostNetns) hostLinks() ([]rdmanl.Link, error) {
	c, err := rdmanl.DialRoute()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Links()
}

// parentDevice reads the device link of the host's sysfs (the hook runs
// in the runtime's mount namespace): the PCI function of an mlx5 HCA,
// none for rxe and siw.
func (h *hostNetns) parentDevice(ibdev string) (string, error) {
	dir := "/sys/class/infiniband/" + ibdev
	if _, err := os.Stat(dir); err != nil {
		return "", err // RDMA netlink just listed it: this is not the host's sysfs
	}
	target, err := os.Readlink(dir + "/device")
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return filepath.Base(target), nil
}

func (h *hostNetns) nodeUse(index int, nodeIPs []netip.Addr) (string, error) {
	c, err := rdmanl.DialRoute()
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.NodeUse(index, nodeIPs)
}

func (h *hostNetns) moveLink(index int) error {
	c, err := rdmanl.DialRoute()
	if err != nil {
		return err
	}
	defer c.Close()
	return c.MoveLinkIndex(index, int(h.ns.Fd()))
}
