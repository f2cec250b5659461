package rdmanl

import (
	"time"

	"golang.org/x/sys/unix"
)

type socket struct{ fd int }

const (
	protoRDMA  = unix.NETLINK_RDMA
	protoRoute = unix.NETLINK_ROUTE
)

// openSocket opens a netlink socket of proto in the calling thread's
// network namespace, which the socket keeps for its life.
func openSocket(proto int, timeout time.Duration) (*socket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, err
	}
	s := &socket{fd: fd}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		s.close()
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *socket) send(b []byte) error {
	return unix.Sendto(s.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

// recv reads one datagram from the kernel; n is its full length even when
// it did not fit (MSG_TRUNC). Datagrams from other processes are dropped.
func (s *socket) recv(buf []byte) (int, error) {
	for {
		n, from, err := unix.Recvfrom(s.fd, buf, unix.MSG_TRUNC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if sa, ok := from.(*unix.SockaddrNetlink); ok && sa.Pid != 0 {
			continue
		}
		return n, nil
	}
}

func (s *socket) close() error { return unix.Close(s.fd) }
