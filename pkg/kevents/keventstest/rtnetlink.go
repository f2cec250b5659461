//go:build linux

package keventstest

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// AddAddress adds an address to the interface name, as `ip addr add` would;
// the kernel then sends an RTM_NEWADDR message. IPv6 addresses skip
// duplicate address detection, so there is one message, not two.
func AddAddress(name string, p netip.Prefix) error {
	return changeAddress(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, name, p)
}

// DelAddress removes an address added by AddAddress (RTM_DELADDR).
func DelAddress(name string, p netip.Prefix) error {
	return changeAddress(unix.RTM_DELADDR, 0, name, p)
}

func changeAddress(typ, flags uint16, name string, p netip.Prefix) error {
	if !p.IsValid() {
		return fmt.Errorf("address %v on %s: not a valid prefix", p, name)
	}
	index, err := ifindex(name)
	if err != nil {
		return fmt.Errorf("address %v on %s: %w", p, name, err)
	}
	a := p.Addr()
	body := make([]byte, unix.SizeofIfAddrmsg)
	body[0] = unix.AF_INET
	if a.Is6() {
		body[0] = unix.AF_INET6
		body[2] = unix.IFA_F_NODAD
	}
	body[1] = byte(p.Bits())
	binary.NativeEndian.PutUint32(body[4:], uint32(index))
	body = append(body, attr(unix.IFA_LOCAL, a.AsSlice())...)
	body = append(body, attr(unix.IFA_ADDRESS, a.AsSlice())...)
	if err := request(typ, flags, body); err != nil {
		return fmt.Errorf("address %v on %s: %w", p, name, err)
	}
	return nil
}

// vethInfoPeer is VETH_INFO_PEER (linux/veth.h): the peer's ifinfomsg and
// attributes.
const vethInfoPeer = 1

// AddVeth creates a veth pair, as `ip link add name type veth peer name
// peer` would. The kernel sends RTM_NEWLINK for both ends.
func AddVeth(name, peer string) error {
	peerInfo := append(make([]byte, unix.SizeofIfInfomsg), attr(unix.IFLA_IFNAME, cstr(peer))...)
	data := attr(vethInfoPeer, peerInfo)
	info := append(attr(unix.IFLA_INFO_KIND, cstr("veth")), attr(unix.IFLA_INFO_DATA, data)...)
	body := make([]byte, unix.SizeofIfInfomsg)
	body = append(body, attr(unix.IFLA_IFNAME, cstr(name))...)
	body = append(body, attr(unix.IFLA_LINKINFO, info)...)
	if err := request(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body); err != nil {
		return fmt.Errorf("veth pair %s/%s: %w", name, peer, err)
	}
	return nil
}

// Index is the interface index of name, in the calling thread's namespace.
func Index(name string) (int, error) { return ifindex(name) }

func ifindex(name string) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, fmt.Errorf("index of %s: %w", name, err)
	}
	return int(ifr.Uint32()), nil
}

// request sends one rtnetlink request and returns the kernel's answer.
func request(typ, flags uint16, body []byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("rtnetlink socket: %w", err)
	}
	defer unix.Close(fd)
	const seq = 1
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|flags)
	binary.NativeEndian.PutUint32(msg[8:], seq)
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("rtnetlink request: %w", err)
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("rtnetlink answer: %w", err)
		}
		// The answer to a request with NLM_F_ACK is one NLMSG_ERROR: a
		// negative errno, or 0 for success.
		if n < unix.SizeofNlMsghdr+4 {
			return fmt.Errorf("rtnetlink answer of %d bytes", n)
		}
		if binary.NativeEndian.Uint16(buf[4:]) != unix.NLMSG_ERROR || binary.NativeEndian.Uint32(buf[8:]) != seq {
			continue
		}
		if errno := int32(binary.NativeEndian.Uint32(buf[16:])); errno != 0 {
			return unix.Errno(-errno)
		}
		return nil
	}
}

func attr(typ uint16, val []byte) []byte {
	n := unix.SizeofRtAttr + len(val)
	b := make([]byte, unix.SizeofRtAttr, (n+3)&^3)
	binary.NativeEndian.PutUint16(b[0:], uint16(n))
	binary.NativeEndian.PutUint16(b[2:], typ)
	b = append(b, val...)
	return append(b, make([]byte, cap(b)-len(b))...) // zero padding to 4 bytes
}

func cstr(s string) []byte { return append([]byte(s), 0) }
