//go:build linux

package main

import (
	"fmt"
	"os"
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

func (h *hostNetns) netdev(s side, name string) (bool, error) {
	c, err := dial(h, s, rdmanl.DialRoute)
	if err != nil {
		return false, err
	}
	defer c.Close()
	_, ok, err := c.LinkIndex(name)
	return ok, err
}

func (h *hostNetns) moveNetdev(name string) error {
	c, err := rdmanl.DialRoute()
	if err != nil {
		return err
	}
	defer c.Close()
	return c.MoveLink(name, int(h.ns.Fd()))
}
