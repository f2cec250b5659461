package kevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Watcher holds the two netlink sockets and delivers their events.
type Watcher struct {
	events chan Event
	files  []*os.File
	wg     sync.WaitGroup
	once   sync.Once
	done   chan struct{} // closed by Close

	mu  sync.Mutex
	err error // the first read error that ended a socket
}

// Option configures Open.
type Option func(*options)

type options struct {
	buffer        int
	link, uevents bool
	allUevents    bool // tests: keep uevents of any subsystem
}

// WithBuffer sets how many events may wait for the reader (default 64).
// When it is full, further events are dropped: the waiting ones already
// promise a rescan that comes after them.
func WithBuffer(n int) Option { return func(o *options) { o.buffer = n } }

// WithoutLink and WithoutUevents leave one of the two sockets closed:
// the rtnetlink one (link and address messages) or the uevent one.
func WithoutLink() Option    { return func(o *options) { o.link = false } }
func WithoutUevents() Option { return func(o *options) { o.uevents = false } }

// Open subscribes to link and address messages and kernel uevents. Sockets
// belong to the network namespace of the calling thread: link and address
// messages and net uevents come only for that namespace's netdevs (the
// host's with hostNetwork; never a pod's); uevents of other subsystems come
// in every namespace. Needs no privilege.
func Open(opts ...Option) (*Watcher, error) {
	o := options{buffer: 64, link: true, uevents: true}
	for _, opt := range opts {
		opt(&o)
	}
	w := &Watcher{events: make(chan Event, max(o.buffer, 1)), done: make(chan struct{})}
	type sub struct {
		name          string
		proto, groups int
		parse         func([]byte) ([]Event, error)
		prepare       func() // after the socket is open, before its first read
	}
	var subs []sub
	if o.link {
		rf := &routeFilter{}
		subs = append(subs, sub{"rtnetlink", unix.NETLINK_ROUTE,
			unix.RTMGRP_LINK | unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR, rf.parse,
			func() {
				// Best effort: without the links, addresses on veths that
				// existed before Open cause needless rescans.
				_ = rf.loadLinks()
			}})
	}
	if o.uevents {
		parse := parseUevents
		if o.allUevents {
			parse = func(b []byte) ([]Event, error) {
				ev, _, err := ParseUevent(b)
				return []Event{ev}, err
			}
		}
		subs = append(subs, sub{"uevent", unix.NETLINK_KOBJECT_UEVENT, 1, parse, nil})
	}
	for _, s := range subs {
		f, err := openNetlink(s.name, s.proto, s.groups)
		if err != nil {
			w.Close()
			return nil, err
		}
		w.files = append(w.files, f)
		if s.prepare != nil {
			s.prepare()
		}
		w.wg.Add(1)
		go w.read(f, s.parse)
	}
	return w, nil
}

func parseUevents(b []byte) ([]Event, error) {
	ev, ok, err := ParseUevent(b)
	if !ok || err != nil {
		return nil, err
	}
	return []Event{ev}, nil
}

// loadLinks seeds the filter with every link of the namespace, read whole
// from a socket of its own before the event socket is first read. (A dump
// asked for on the event socket arrives in parts as the reader reads: an
// address message queued before a later part passed the filter, in 7 of
// 30 runs.) A link made meanwhile is on the event socket as a newlink,
// ahead of its addresses.
func (r *routeFilter) loadLinks() error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("rtnetlink dump socket: %w", err)
	}
	defer unix.Close(fd)
	// The kernel always answers; the timeout only bounds a surprise.
	tv := unix.Timeval{Sec: 5}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("rtnetlink dump socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("rtnetlink dump socket: %w", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fmt.Errorf("rtnetlink dump socket: its port id: %w", err)
	}
	nl, ok := sa.(*unix.SockaddrNetlink)
	if !ok {
		return errors.New("rtnetlink dump socket: not a netlink address")
	}
	req := make([]byte, nlmsgHdrLen+ifinfomsgLen) // ifinfomsg all zero: AF_UNSPEC, every link
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.RTM_GETLINK)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], dumpSeq)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("rtnetlink: asking for the links: %w", err)
	}
	r.dumpPort, r.dumpSeq = nl.Pid, dumpSeq
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("rtnetlink: reading the links: %w", err)
		}
		ended, err := dumpEnded(buf[:n])
		if err != nil {
			return err
		}
		if _, err := r.parse(buf[:n]); err != nil {
			return err
		}
		if ended {
			return nil
		}
	}
}

// dumpEnded says whether b holds a dump's NLMSG_DONE, or its error.
func dumpEnded(b []byte) (bool, error) {
	for len(b) >= nlmsgHdrLen {
		n := int(binary.NativeEndian.Uint32(b[0:4]))
		if n < nlmsgHdrLen || n > len(b) {
			return false, fmt.Errorf("rtnetlink: message length %d outside 16..%d", n, len(b))
		}
		switch binary.NativeEndian.Uint16(b[4:6]) {
		case unix.NLMSG_DONE:
			return true, nil
		case unix.NLMSG_ERROR:
			if n >= nlmsgHdrLen+4 {
				if code := int32(binary.NativeEndian.Uint32(b[16:20])); code != 0 {
					return true, fmt.Errorf("rtnetlink: the link dump failed: %w", unix.Errno(-code))
				}
			}
			return true, nil
		}
		b = b[min(align(n), len(b)):]
	}
	return false, nil
}

func openNetlink(name string, proto, groups int) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, proto)
	if err != nil {
		return nil, fmt.Errorf("%s netlink socket: %w", name, err)
	}
	// A driver reload sends hundreds of uevents at once; a larger buffer
	// makes an overflow (and its full rescan) rarer. Best effort.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: uint32(groups)}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s netlink socket: binding to group %#x: %w", name, groups, err)
	}
	// Non-blocking, so the runtime poller serves reads and Close ends them.
	return os.NewFile(uintptr(fd), name), nil
}

// Events delivers events until Close; it is closed after the last one.
func (w *Watcher) Events() <-chan Event { return w.events }

// Err is the read error that stopped a socket early, if any.
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close stops both sockets and closes Events. Safe to call twice.
func (w *Watcher) Close() error {
	w.once.Do(func() {
		close(w.done)
		for _, f := range w.files {
			f.Close()
		}
		go func() { w.wg.Wait(); close(w.events) }()
	})
	return nil
}

func (w *Watcher) read(f *os.File, parse func([]byte) ([]Event, error)) {
	defer w.wg.Done()
	rc, err := f.SyscallConn()
	if err != nil {
		w.fail(f.Name(), err)
		return
	}
	buf := make([]byte, 64<<10)
	for {
		var n int
		var from unix.Sockaddr
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, from, rerr = unix.Recvfrom(int(fd), buf, 0)
			return rerr != unix.EAGAIN && rerr != unix.EWOULDBLOCK
		})
		if err != nil {
			w.fail(f.Name(), err)
			return
		}
		switch {
		case rerr == unix.ENOBUFS:
			w.send(Event{Source: Overflow})
			continue
		case rerr == unix.EINTR:
			continue
		case rerr != nil:
			w.fail(f.Name(), rerr)
			return
		}
		// Only the kernel (port id 0) speaks for the hardware; any process
		// may send to a netlink group it joined.
		if nl, ok := from.(*unix.SockaddrNetlink); !ok || nl.Pid != 0 {
			continue
		}
		evs, _ := parse(buf[:n]) // a garbled datagram still yields what came before it
		for _, ev := range evs {
			w.send(ev)
		}
	}
}

func (w *Watcher) send(ev Event) {
	select {
	case w.events <- ev:
	default:
	}
}

func (w *Watcher) fail(name string, err error) {
	select {
	case <-w.done:
		return // the end Close asked for
	default:
	}
	err = fmt.Errorf("reading the %s socket: %w", name, err)
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	// Told, not just recorded: the reader logs it and knows polling is
	// all that is left for this socket. Waits for room rather than drop it.
	select {
	case w.events <- Event{Source: Failed, Err: err.Error()}:
	case <-w.done:
	}
}
