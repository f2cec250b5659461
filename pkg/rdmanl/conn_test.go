package rdmanl

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// scriptedKernel answers requests the way the kernel lays its answers
// out; answer gets the request's type, sequence number and device index.
type scriptedKernel struct {
	answer  func(typ uint16, seq, dev uint32) [][]byte
	pending [][]byte
	sent    int
}

func (k *scriptedKernel) send(b []byte) error {
	k.sent++
	msgs, err := splitMessages(b)
	if err != nil || len(msgs) != 1 {
		return errors.New("bad request")
	}
	s, err := attrsOf(msgs[0].payload)
	if err != nil {
		return err
	}
	dev, _, _ := s.u32(attrDevIndex)
	k.pending = k.answer(msgs[0].typ, msgs[0].seq, dev)
	return nil
}

func (k *scriptedKernel) recv(buf []byte) (int, error) {
	if len(k.pending) == 0 {
		return 0, syscall.EAGAIN
	}
	d := k.pending[0]
	k.pending = k.pending[1:]
	copy(buf, d)
	return len(d), nil // the full length, as with MSG_TRUNC
}

func (k *scriptedKernel) close() error { return nil }

// twoDevices is a VM with rxe0 on eth0 and siw0 on eth1. Every message
// comes in a datagram of its own, so a dump spans several.
func twoDevices(typ uint16, seq, dev uint32) [][]byte {
	switch typ {
	case typeGet:
		siw := nlmsg(typeGet, 2, seq, nla(1, u32b(1)), nla(2, strz("siw0")), nla(3, u32b(1)), nla(14, u8b(4)))
		return [][]byte{rxeDevice(seq), siw, nldone(seq, 0)}
	case typePortGet:
		names := map[uint32][2]string{0: {"rxe0", "eth0"}, 1: {"siw0", "eth1"}}
		n, ok := names[dev]
		if !ok {
			return [][]byte{nlerr(seq, syscall.ENODEV, typ)}
		}
		return [][]byte{nlmsg(typePortGet, 2, seq, nla(1, u32b(dev)), nla(2, strz(n[0])), nla(3, u32b(1)),
			nla(12, u8b(4)), nla(13, u8b(5)), nla(50, u32b(2+dev)), nla(51, strz(n[1]))), nldone(seq, 0)}
	case typeSysGet:
		return [][]byte{nlmsg(typeSysGet, 0, seq, nla(66, u8b(0)), nla(78, u8b(0)))}
	}
	return [][]byte{nlerr(seq, syscall.EOPNOTSUPP, typ)}
}

func TestConn(t *testing.T) {
	k := &scriptedKernel{answer: twoDevices}
	c := newConn(k)
	defer c.Close()

	links, err := c.Links()
	if err != nil {
		t.Fatal(err)
	}
	want := []Port{
		{DevIndex: 0, DevName: "rxe0", Index: 1, State: 4, PhysState: 5, NetdevIndex: 2, Netdev: "eth0"},
		{DevIndex: 1, DevName: "siw0", Index: 1, State: 4, PhysState: 5, NetdevIndex: 3, Netdev: "eth1"},
	}
	if diff := cmp.Diff(want, links); diff != "" {
		t.Errorf("links (-want +got):\n%s", diff)
	}
	sys, err := c.System()
	if err != nil || sys.NetnsMode != NetnsExclusive {
		t.Errorf("system = %+v, %v; want exclusive", sys, err)
	}
	if k.sent != 4 {
		t.Errorf("%d requests, want 4 (devices, two port dumps, system)", k.sent)
	}
}

func TestConnErrors(t *testing.T) {
	tests := []struct {
		name    string
		answer  func(typ uint16, seq, dev uint32) [][]byte
		call    func(*Conn) error
		wantErr string
	}{
		{
			name: "port dump refused",
			answer: func(typ uint16, seq, dev uint32) [][]byte {
				if typ == typePortGet {
					return [][]byte{nlerr(seq, syscall.EOPNOTSUPP, typ)}
				}
				return twoDevices(typ, seq, dev)
			},
			call:    func(c *Conn) error { _, err := c.Links(); return err },
			wantErr: "rdma netlink: port dump of rxe0: operation not supported",
		},
		{
			name: "device gone between the dumps",
			answer: func(typ uint16, seq, dev uint32) [][]byte {
				if typ == typePortGet && dev == 1 {
					return [][]byte{nlerr(seq, syscall.ENODEV, typ)}
				}
				return twoDevices(typ, seq, dev)
			},
			call: func(c *Conn) error {
				l, err := c.Links()
				if err == nil && len(l) != 1 {
					return errors.New("want only rxe0's port")
				}
				return err
			},
		},
		{
			name:    "no answer",
			answer:  func(uint16, uint32, uint32) [][]byte { return nil },
			call:    func(c *Conn) error { _, err := c.System(); return err },
			wantErr: "rdma netlink: system query: no reply within 5s",
		},
		{
			name:    "dump without its end",
			answer:  func(_ uint16, seq, _ uint32) [][]byte { return [][]byte{rxeDevice(seq)} },
			call:    func(c *Conn) error { _, err := c.Devices(); return err },
			wantErr: "rdma netlink: device dump: no reply within 5s",
		},
		{
			name: "garbled device",
			answer: func(_ uint16, seq, _ uint32) [][]byte {
				return [][]byte{nlmsg(typeGet, 2, seq, nla(1, u32b(3)), nla(2, strz("rxe3")), nla(6, u32b(1))), nldone(seq, 0)}
			},
			call:    func(c *Conn) error { _, err := c.Devices(); return err },
			wantErr: "rdma netlink: device dump: device 3 (rxe3): attribute NODE_GUID (6): want 8 bytes, got 4",
		},
		{
			name: "answer about another device",
			answer: func(typ uint16, seq, dev uint32) [][]byte {
				if typ == typePortGet {
					return twoDevices(typ, seq, 1-dev)
				}
				return twoDevices(typ, seq, dev)
			},
			call:    func(c *Conn) error { _, err := c.Links(); return err },
			wantErr: "rdma netlink: port dump of rxe0: answer for device 1 (siw0)",
		},
		{
			name:    "datagram larger than the buffer",
			answer:  func(_ uint16, seq, _ uint32) [][]byte { return [][]byte{make([]byte, 70<<10)} },
			call:    func(c *Conn) error { _, err := c.Devices(); return err },
			wantErr: "rdma netlink: device dump: reply of 71680 bytes exceeds the 65536-byte buffer",
		},
		{
			name:    "closed",
			answer:  twoDevices,
			call:    func(c *Conn) error { c.Close(); _, err := c.Devices(); return err },
			wantErr: "rdma netlink: device dump: connection closed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(newConn(&scriptedKernel{answer: tt.answer}))
			checkErr(t, err, tt.wantErr)
		})
	}
}

// TestRealKernel asks this host's kernel. Hosts without ib_core have no
// RDMA netlink at all; the VM suite (test/vm) runs it on a kernel with
// Soft-RoCE.
func TestRealKernel(t *testing.T) {
	c, err := Dial()
	if errors.Is(err, syscall.EPROTONOSUPPORT) {
		t.Skipf("no RDMA netlink on this kernel (ib_core not loaded): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sys, err := c.System()
	if err != nil {
		t.Fatal(err)
	}
	if sys.NetnsMode != NetnsShared && sys.NetnsMode != NetnsExclusive {
		t.Errorf("netns mode %v", sys.NetnsMode)
	}
	devs, err := c.Devices()
	if err != nil {
		t.Fatal(err)
	}
	links, err := c.Links()
	if err != nil {
		t.Fatal(err)
	}
	// Every device of this namespace is in its sysfs class and agrees with
	// it; so do its ports and their netdevs.
	sysfs := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Error(err)
		}
		return strings.TrimSpace(string(b))
	}
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
		dir := "/sys/class/infiniband/" + d.Name
		if got := FormatGUID(d.NodeGUID); got != sysfs(dir+"/node_guid") {
			t.Errorf("%s: node GUID %s, sysfs %s", d.Name, got, sysfs(dir+"/node_guid"))
		}
		if got := FormatGUID(d.SysImageGUID); got != sysfs(dir+"/sys_image_guid") {
			t.Errorf("%s: system image GUID %s, sysfs %s", d.Name, got, sysfs(dir+"/sys_image_guid"))
		}
		if d.FWVersion != sysfs(dir+"/fw_ver") {
			t.Errorf("%s: firmware %q, sysfs %q", d.Name, d.FWVersion, sysfs(dir+"/fw_ver"))
		}
		if nt := sysfs(dir + "/node_type"); !strings.HasPrefix(nt, fmt.Sprintf("%d: ", d.NodeType)) {
			t.Errorf("%s: node type %d, sysfs %q", d.Name, d.NodeType, nt)
		}
		n := 0
		for _, l := range links {
			if l.DevIndex != d.Index {
				continue
			}
			n++
			port := fmt.Sprintf("%s/ports/%d/", dir, l.Index)
			if st := sysfs(port + "state"); !strings.HasPrefix(st, fmt.Sprintf("%d: ", l.State)) {
				t.Errorf("%s port %d: state %d, sysfs %q", d.Name, l.Index, l.State, st)
			}
			if l.Netdev != "" && sysfs("/sys/class/net/"+l.Netdev+"/ifindex") != fmt.Sprint(l.NetdevIndex) {
				t.Errorf("%s port %d: netdev %s index %d, sysfs %s", d.Name, l.Index, l.Netdev, l.NetdevIndex,
					sysfs("/sys/class/net/"+l.Netdev+"/ifindex"))
			}
			t.Logf("%s port %d: state %d phys %d netdev %q (%d)", d.Name, l.Index, l.State, l.PhysState, l.Netdev, l.NetdevIndex)
		}
		if uint32(n) != d.Ports {
			t.Errorf("%s: %d ports dumped, the device says %d", d.Name, n, d.Ports)
		}
	}
	entries, err := os.ReadDir("/sys/class/infiniband")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var class []string
	for _, e := range entries {
		class = append(class, e.Name())
	}
	slices.Sort(names)
	if !slices.Equal(names, class) {
		t.Errorf("netlink devices %v, /sys/class/infiniband %v", names, class)
	}
	t.Logf("netns mode %v; devices %s", sys.NetnsMode, strings.Join(names, " "))
}
