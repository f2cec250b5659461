package rdmanl

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"
)

// Layouts from include/uapi/rdma/rdma_netlink.h (Linux 6.1):
// RDMA_NLDEV_CMD_SET = 2, RDMA_NLDEV_ATTR_DEV_INDEX = 1,
// RDMA_NLDEV_NET_NS_FD = 68 (after RDMA_NLDEV_ATTR_DEV_PROTOCOL, 67); and
// include/uapi/linux/rtnetlink.h, if_link.h: RTM_NEWLINK = 16,
// RTM_GETLINK = 18, IFLA_IFNAME = 3, IFLA_NET_NS_FD = 28.
const (
	typeSet     = 5<<10 | 2 // 0x1402
	nlmFRequest = 0x1
	nlmFAck     = 0x4
)

func littleEndian(t *testing.T) {
	t.Helper()
	if nat.Uint16([]byte{1, 0}) != 1 {
		t.Skip("this host's CPU is big-endian: the expected bytes are for a little-endian CPU (amd64, arm64), which this test waits for")
	}
}

func TestEncodeSetNetns(t *testing.T) {
	littleEndian(t)
	got := encodeSetNetns(9, 3, 7)
	want := []byte{
		32, 0, 0, 0, // nlmsg_len
		0x02, 0x14, // RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_SET)
		0x05, 0x00, // NLM_F_REQUEST | NLM_F_ACK
		9, 0, 0, 0, // seq
		0, 0, 0, 0, // pid
		8, 0, 1, 0, // RDMA_NLDEV_ATTR_DEV_INDEX
		3, 0, 0, 0,
		8, 0, 68, 0, // RDMA_NLDEV_NET_NS_FD
		7, 0, 0, 0,
	}
	if !bytes.Equal(got, want) {
		t.Errorf("SET netns:\n got % x\nwant % x", got, want)
	}
	if !bytes.Equal(got, nlmsg(typeSet, nlmFRequest|nlmFAck, 9, nla(1, u32b(3)), nla(68, u32b(7)))) {
		t.Error("SET netns differs from the hand-built message")
	}
}

func TestEncodeLink(t *testing.T) {
	littleEndian(t)
	ifinfo := make([]byte, 16) // struct ifinfomsg, AF_UNSPEC, index 0
	tests := []struct {
		name string
		got  []byte
		want []byte
	}{
		{
			name: "RTM_GETLINK by name",
			got:  encodeGetLink(4, "eth1"),
			want: append(append([]byte{
				44, 0, 0, 0, 18, 0, 0x01, 0x00, 4, 0, 0, 0, 0, 0, 0, 0,
			}, ifinfo...), 9, 0, 3, 0, 'e', 't', 'h', '1', 0, 0, 0, 0),
		},
		{
			name: "RTM_NEWLINK moving a netdev",
			got:  encodeMoveLink(5, "ens1f0np0", 11),
			want: append(append([]byte{
				56, 0, 0, 0, 16, 0, 0x05, 0x00, 5, 0, 0, 0, 0, 0, 0, 0,
			}, ifinfo...), 14, 0, 3, 0, 'e', 'n', 's', '1', 'f', '0', 'n', 'p', '0', 0, 0, 0,
				8, 0, 28, 0, 11, 0, 0, 0),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !bytes.Equal(tt.got, tt.want) {
				t.Errorf("\n got % x\nwant % x", tt.got, tt.want)
			}
		})
	}
}

// ackKernel answers every request with answer(request).
type ackKernel struct {
	answer  func(req message) [][]byte
	reqs    []message
	pending [][]byte
}

func (k *ackKernel) send(b []byte) error {
	msgs, err := splitMessages(append([]byte(nil), b...))
	if err != nil || len(msgs) != 1 {
		return errors.New("bad request")
	}
	k.reqs = append(k.reqs, msgs[0])
	k.pending = k.answer(msgs[0])
	return nil
}

func (k *ackKernel) recv(buf []byte) (int, error) {
	if len(k.pending) == 0 {
		return 0, syscall.EAGAIN
	}
	d := k.pending[0]
	k.pending = k.pending[1:]
	return copy(buf, d), nil
}

func (k *ackKernel) close() error { return nil }

func TestMoveToNetns(t *testing.T) {
	rxe := Device{Index: 2, Name: "rxe0"}
	tests := []struct {
		name    string
		errno   syscall.Errno
		fd      int
		wantErr string
	}{
		{name: "acknowledged", fd: 5},
		{name: "rxe cannot move", errno: syscall.EOPNOTSUPP, fd: 5,
			wantErr: "rdma netlink: netns move of rxe0: operation not supported"},
		{name: "not in the socket's namespace", errno: syscall.EINVAL, fd: 5,
			wantErr: "rdma netlink: netns move of rxe0: invalid argument"},
		{name: "no capability", errno: syscall.EPERM, fd: 5, wantErr: "operation not permitted"},
		{name: "bad fd", fd: -1, wantErr: "netns move of rxe0: bad namespace fd -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := &ackKernel{answer: func(req message) [][]byte {
				return [][]byte{nlerr(req.seq, tt.errno, req.typ)}
			}}
			err := newConn(k).MoveToNetns(rxe, tt.fd)
			checkErr(t, err, tt.wantErr)
			if tt.errno != 0 && !errors.Is(err, tt.errno) {
				t.Errorf("error %v does not carry %v", err, tt.errno)
			}
			if tt.fd < 0 {
				return
			}
			if len(k.reqs) != 1 || k.reqs[0].typ != typeSet || k.reqs[0].flags != nlmFRequest|nlmFAck {
				t.Fatalf("requests %+v", k.reqs)
			}
			s, err := attrsOf(k.reqs[0].payload)
			if err != nil {
				t.Fatal(err)
			}
			if idx, _, _ := s.u32(1); idx != 2 {
				t.Errorf("DEV_INDEX %d, want 2", idx)
			}
			if fd, _, _ := s.u32(68); fd != 5 {
				t.Errorf("NET_NS_FD %d, want 5", fd)
			}
		})
	}
}

func TestDeviceByName(t *testing.T) {
	c := newConn(&scriptedKernel{answer: twoDevices})
	d, ok, err := c.Device("siw0")
	if err != nil || !ok || d.Index != 1 {
		t.Errorf("siw0: %+v, %v, %v", d, ok, err)
	}
	if _, ok, err := c.Device("mlx5_0"); ok || err != nil {
		t.Errorf("mlx5_0: found %v, %v; want absent", ok, err)
	}
}

func TestRouteConn(t *testing.T) {
	linkAnswer := func(seq uint32, index int32) []byte {
		info := make([]byte, 16)
		nat.PutUint32(info[4:], uint32(index))
		return nlmsg(16, 0, seq, info, nla(3, strz("eth1")))
	}
	tests := []struct {
		name    string
		answer  func(req message) [][]byte
		call    func(*RouteConn) (any, error)
		want    any
		wantErr string
	}{
		{
			name:   "link found",
			answer: func(req message) [][]byte { return [][]byte{linkAnswer(req.seq, 7)} },
			call:   func(r *RouteConn) (any, error) { i, ok, err := r.LinkIndex("eth1"); return [2]any{i, ok}, err },
			want:   [2]any{7, true},
		},
		{
			name:   "no such link",
			answer: func(req message) [][]byte { return [][]byte{nlerr(req.seq, syscall.ENODEV, req.typ)} },
			call:   func(r *RouteConn) (any, error) { i, ok, err := r.LinkIndex("eth1"); return [2]any{i, ok}, err },
			want:   [2]any{0, false},
		},
		{
			name:    "short answer",
			answer:  func(req message) [][]byte { return [][]byte{nlmsg(16, 0, req.seq, u32b(0))} },
			call:    func(r *RouteConn) (any, error) { _, _, err := r.LinkIndex("eth1"); return nil, err },
			wantErr: "rtnetlink: lookup of netdev eth1: truncated message: link answer of 4 bytes",
		},
		{
			name:    "bad name",
			call:    func(r *RouteConn) (any, error) { _, _, err := r.LinkIndex("a/b"); return nil, err },
			wantErr: `rtnetlink: lookup of netdev a/b: netdev name "a/b": byte '/' is not allowed`,
		},
		{
			name:    "name too long",
			call:    func(r *RouteConn) (any, error) { return nil, r.MoveLink("abcdefghijklmnop", 3) },
			wantErr: "want 1 to 15 bytes",
		},
		{
			name:   "move acknowledged",
			answer: func(req message) [][]byte { return [][]byte{nlerr(req.seq, 0, req.typ)} },
			call:   func(r *RouteConn) (any, error) { return nil, r.MoveLink("eth1", 3) },
		},
		{
			name:    "move refused",
			answer:  func(req message) [][]byte { return [][]byte{nlerr(req.seq, syscall.EINVAL, req.typ)} },
			call:    func(r *RouteConn) (any, error) { return nil, r.MoveLink("eth1", 3) },
			wantErr: "rtnetlink: netns move of netdev eth1: invalid argument",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := &ackKernel{answer: tt.answer}
			got, err := tt.call(&RouteConn{c: newConn(k)})
			checkErr(t, err, tt.wantErr)
			if tt.wantErr == "" && got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRealKernelSet sends SET to this host's kernel: a device index no
// device has, so nothing moves, but the kernel parses the message.
func TestRealKernelSet(t *testing.T) {
	c, err := Dial()
	if errors.Is(err, syscall.EPROTONOSUPPORT) {
		t.Skipf("no RDMA netlink on this kernel (ib_core not loaded): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Skipf("no network namespace file: %v", err)
	}
	defer ns.Close()
	err = c.MoveToNetns(Device{Index: 1 << 30, Name: "absent"}, int(ns.Fd()))
	// nldev_set_doit: an unknown index is EINVAL; without CAP_NET_ADMIN EPERM.
	if !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.EPERM) {
		t.Errorf("moving an absent device: %v, want EINVAL (or EPERM)", err)
	}
}

// TestRealKernelRoute asks this host's rtnetlink: lo exists with index 1
// in every namespace, and moving a netdev that does not exist is ENODEV
// (the kernel parsed the message and looked the name up).
func TestRealKernelRoute(t *testing.T) {
	r, err := DialRoute()
	if err != nil {
		t.Skipf("no rtnetlink socket here: %v", err)
	}
	defer r.Close()
	idx, ok, err := r.LinkIndex("lo")
	if err != nil || !ok || idx != 1 {
		t.Errorf("lo: index %d, found %v, %v; want 1", idx, ok, err)
	}
	if _, ok, err := r.LinkIndex("rdmanl-absent"); ok || err != nil {
		t.Errorf("absent netdev: found %v, %v", ok, err)
	}
	ns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Skipf("no network namespace file: %v", err)
	}
	defer ns.Close()
	err = r.MoveLink("rdmanl-absent", int(ns.Fd()))
	if !errors.Is(err, syscall.ENODEV) && !errors.Is(err, syscall.EPERM) {
		t.Errorf("moving an absent netdev: %v, want ENODEV (or EPERM)", err)
	}
}
