//go:build linux

// Package keventstest makes the kernel send link and address messages, for
// tests of code that follows them.
package keventstest

import "golang.org/x/sys/unix"

// SetLinkUp sets or clears IFF_UP of the interface name in the calling
// thread's network namespace, with the ioctl ip(8) would use; the kernel
// then sends an RTM_NEWLINK message. Tests call it from a thread locked in
// a private namespace so the host's links stay untouched.
func SetLinkUp(name string, up bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	flags := ifr.Uint16() &^ unix.IFF_UP
	if up {
		flags |= unix.IFF_UP
	}
	ifr.SetUint16(flags)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
