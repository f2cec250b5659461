//go:build !linux

package rdmanl

import (
	"errors"
	"time"
)

type socket struct{}

var errNotLinux = errors.New("RDMA netlink exists on Linux only")

func openSocket(time.Duration) (*socket, error) { return nil, errNotLinux }
func (*socket) send([]byte) error               { return errNotLinux }
func (*socket) recv([]byte) (int, error)        { return 0, errNotLinux }
func (*socket) close() error                    { return nil }
