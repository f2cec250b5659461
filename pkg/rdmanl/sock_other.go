//go:build !linux

package rdmanl

import (
	"errors"
	"time"
)

type socket struct{}

var errNotLinux = errors.New("RDMA netlink exists on Linux only")

const (
	protoRDMA  = 20
	protoRoute = 0
)

func openSocket(int, time.Duration) (*socket, error) { return nil, errNotLinux }
func (*socket) send([]byte) error                    { return errNotLinux }
func (*socket) recv([]byte) (int, error)             { return 0, errNotLinux }
func (*socket) close() error                         { return nil }
