package rdmanl

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"
)

// Timeout bounds the wait for each reply datagram.
const Timeout = 5 * time.Second

// Conn is one RDMA netlink socket. Its methods may be called from several
// goroutines; requests are serialised.
type Conn struct {
	mu  sync.Mutex
	s   transport
	seq uint32
	buf []byte
}

// transport is the socket; tests stand in for the kernel behind it.
type transport interface {
	send([]byte) error
	recv([]byte) (int, error) // n is the datagram's full length, even when cut
	close() error
}

// Dial opens an RDMA netlink socket in the caller's network namespace. It
// fails with EPROTONOSUPPORT (errors.Is(err, syscall.EPROTONOSUPPORT)) when
// the kernel has no RDMA netlink, i.e. ib_core is not loaded.
func Dial() (*Conn, error) {
	s, err := openSocket(protoRDMA, Timeout)
	if err != nil {
		return nil, &Error{Op: "socket", Err: err}
	}
	return newConn(s), nil
}

func newConn(t transport) *Conn {
	return &Conn{s: t, seq: uint32(time.Now().UnixNano()), buf: make([]byte, 64<<10)}
}

// Close closes the socket.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.s == nil {
		return nil
	}
	err := c.s.close()
	c.s = nil
	return err
}

// do sends one RDMA netlink query and collects its answer's payloads.
func (c *Conn) do(op string, cmd uint16, dump bool, attrs ...attr) ([][]byte, error) {
	return c.exchange(op, msgType(cmd), dump, func(seq uint32) []byte {
		return encodeRequest(cmd, dump, seq, attrs...)
	})
}

// exchange sends the request encode builds for the next sequence number
// and collects the payloads of answers of type typ, until the end of a
// dump, a single answer, or an acknowledgement.
func (c *Conn) exchange(op string, typ uint16, dump bool, encode func(seq uint32) []byte) ([][]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.s == nil {
		return nil, &Error{Op: op, Err: errors.New("connection closed")}
	}
	c.seq++
	r := reply{seq: c.seq, typ: typ, dump: dump}
	if err := c.s.send(encode(c.seq)); err != nil {
		return nil, &Error{Op: op, Err: err}
	}
	for !r.done {
		n, err := c.s.recv(c.buf)
		switch {
		case errors.Is(err, syscall.EAGAIN):
			return nil, &Error{Op: op, Err: fmt.Errorf("no reply within %v", Timeout)}
		case err != nil:
			return nil, &Error{Op: op, Err: err}
		case n > len(c.buf):
			return nil, &Error{Op: op, Err: fmt.Errorf("reply of %d bytes exceeds the %d-byte buffer", n, len(c.buf))}
		}
		// Payloads must outlive the buffer, which the next datagram reuses.
		msgs, err := splitMessages(append([]byte(nil), c.buf[:n]...))
		if err == nil {
			err = r.add(msgs)
		}
		if err != nil {
			return nil, &Error{Op: op, Err: err}
		}
	}
	return r.payloads, nil
}

// Devices lists the RDMA devices of the caller's network namespace (every
// device in shared mode), as "rdma dev" does.
func (c *Conn) Devices() ([]Device, error) {
	const op = "device dump"
	payloads, err := c.do(op, cmdGet, true)
	if err != nil {
		return nil, err
	}
	devs := make([]Device, 0, len(payloads))
	for _, p := range payloads {
		d, err := decodeDevice(p)
		if err != nil {
			return nil, &Error{Op: op, Err: err}
		}
		devs = append(devs, d)
	}
	return devs, nil
}

// Ports lists the ports of one device, as "rdma link show <dev>" does.
func (c *Conn) Ports(dev Device) ([]Port, error) {
	op := "port dump of " + dev.Name
	payloads, err := c.do(op, cmdPortGet, true, u32Attr(attrDevIndex, dev.Index))
	if err != nil {
		return nil, err
	}
	ports := make([]Port, 0, len(payloads))
	for _, p := range payloads {
		port, err := decodePort(p)
		if err != nil {
			return nil, &Error{Op: op, Err: err}
		}
		if port.DevIndex != dev.Index {
			return nil, &Error{Op: op, Err: fmt.Errorf("answer for device %d (%s)", port.DevIndex, port.DevName)}
		}
		ports = append(ports, port)
	}
	return ports, nil
}

// Links lists every port of every device, as "rdma link" does. A device
// that goes away between the two dumps is left out.
func (c *Conn) Links() ([]Port, error) {
	devs, err := c.Devices()
	if err != nil {
		return nil, err
	}
	var all []Port
	for _, d := range devs {
		ports, err := c.Ports(d)
		if errors.Is(err, syscall.ENODEV) {
			continue
		}
		if err != nil {
			return nil, err
		}
		all = append(all, ports...)
	}
	return all, nil
}

// System reads the subsystem's settings, as "rdma system" does.
func (c *Conn) System() (System, error) {
	const op = "system query"
	payloads, err := c.do(op, cmdSysGet, false)
	if err != nil {
		return System{}, err
	}
	if len(payloads) != 1 {
		return System{}, &Error{Op: op, Err: fmt.Errorf("%d answers, want 1", len(payloads))}
	}
	s, err := decodeSystem(payloads[0])
	if err != nil {
		return System{}, &Error{Op: op, Err: err}
	}
	return s, nil
}

// Device finds the device called name among those of the caller's
// namespace; ok is false when it is not there (in exclusive mode: gone,
// or in another namespace).
func (c *Conn) Device(name string) (dev Device, ok bool, err error) {
	devs, err := c.Devices()
	if err != nil {
		return Device{}, false, err
	}
	for _, d := range devs {
		if d.Name == name {
			return d, true, nil
		}
	}
	return Device{}, false, nil
}

// MoveToNetns moves dev into the network namespace nsFD refers to (an
// open /proc/PID/ns/net or /run/netns/NAME), as "rdma dev set DEV netns NS"
// does. It needs CAP_NET_ADMIN, exclusive netns mode and a driver that can
// disassociate its users (mlx5 can; rxe and siw answer EOPNOTSUPP, and so
// does every device in shared mode). The kernel looks dev up in the
// socket's namespace.
func (c *Conn) MoveToNetns(dev Device, nsFD int) error {
	if nsFD < 0 {
		return &Error{Op: "netns move of " + dev.Name, Err: fmt.Errorf("bad namespace fd %d", nsFD)}
	}
	_, err := c.exchange("netns move of "+dev.Name, msgType(cmdSet), false, func(seq uint32) []byte {
		return encodeSetNetns(seq, dev.Index, uint32(nsFD))
	})
	return err
}

// Client answers each question on a socket of its own, so the zero value
// is ready and safe for concurrent use. It is what discovery is given on
// a real node.
type Client struct{}

// NetnsMode is the subsystem's network namespace mode.
func (Client) NetnsMode() (NetnsMode, error) {
	c, err := Dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	s, err := c.System()
	return s.NetnsMode, err
}

// Devices lists the devices of the caller's namespace.
func (Client) Devices() ([]Device, error) {
	c, err := Dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Devices()
}

// Links lists every port of every device of the caller's namespace.
func (Client) Links() ([]Port, error) {
	c, err := Dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Links()
}
