package node

// TCP between the host's network namespace and the node's: listeners made
// inside the node's namespace, dials into it, and a byte-copying forwarder.

import (
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// netnsDialer runs one OS thread in the node's network namespace; sockets
// made there belong to that namespace for their whole life.
type netnsDialer struct {
	reqs chan func()
	once sync.Once
}

func newNetnsDialer(nsPath string) (*netnsDialer, error) {
	d := &netnsDialer{reqs: make(chan func())}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread exits with this goroutine, and the
		// namespace switch with it.
		runtime.LockOSThread()
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		errc <- err
		if err != nil {
			return
		}
		for f := range d.reqs {
			f()
		}
	}()
	if err := <-errc; err != nil {
		return nil, errors.New("joining the node's network namespace " + nsPath + ": " + err.Error())
	}
	return d, nil
}

func (d *netnsDialer) do(f func()) (ok bool) {
	defer func() {
		if recover() != nil { // closed
			ok = false
		}
	}()
	done := make(chan struct{})
	d.reqs <- func() { f(); close(done) }
	<-done
	return true
}

func (d *netnsDialer) listen(addr string) (l net.Listener, err error) {
	if !d.do(func() { l, err = net.Listen("tcp", addr) }) {
		return nil, errors.New("node network namespace closed")
	}
	return l, err
}

func (d *netnsDialer) dial(addr string) (c net.Conn, err error) {
	if !d.do(func() { c, err = net.DialTimeout("tcp", addr, 5*time.Second) }) {
		return nil, errors.New("node network namespace closed")
	}
	return c, err
}

func (d *netnsDialer) close() { d.once.Do(func() { close(d.reqs) }) }

// forward accepts on l until it is closed and copies each connection to
// one from dial.
func forward(l net.Listener, dial func() (net.Conn, error)) {
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer in.Close()
			out, err := dial()
			if err != nil {
				return
			}
			defer out.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(out, in); closeWrite(out); done <- struct{}{} }()
			go func() { _, _ = io.Copy(in, out); closeWrite(in); done <- struct{}{} }()
			<-done
			<-done
		}()
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}
