// Package rdmanl is a small client of the kernel's RDMA netlink interface
// (NETLINK_RDMA, the RDMA_NL_NLDEV client that iproute2's "rdma" tool uses):
// the RDMA devices, their ports with the netdev bound to each, the
// subsystem's network namespace mode, and moving a device into another
// network namespace. RouteConn does the rtnetlink side that goes with it:
// moving a netdev by ifindex, and reading the links, default routes and
// addresses that say whether the node's own traffic needs one.
//
// Encoding and decoding are pure functions over byte slices; only Conn
// touches a socket. Nothing here is on a hot path: discovery calls it once
// per pass.
package rdmanl

import (
	"errors"
	"fmt"
)

// Numbers from include/uapi/rdma/rdma_netlink.h as of Linux 6.1 (all of
// them unchanged since 5.3, when RDMA_NLDEV_ATTR_DEV_PROTOCOL was added).
const (
	clientNLDEV = 5 // RDMA_NL_NLDEV

	cmdGet     = 1 // RDMA_NLDEV_CMD_GET (can dump)
	cmdSet     = 2 // RDMA_NLDEV_CMD_SET (CAP_NET_ADMIN): rename, netns move, DIM
	cmdPortGet = 5 // RDMA_NLDEV_CMD_PORT_GET (can dump, per device)
	cmdSysGet  = 6 // RDMA_NLDEV_CMD_SYS_GET

	attrPad          = 0  // RDMA_NLDEV_ATTR_PAD (64-bit alignment filler)
	attrDevIndex     = 1  // u32
	attrDevName      = 2  // string
	attrPortIndex    = 3  // u32: the port, or in a device reply the number of ports
	attrFWVersion    = 5  // string, absent when the device has none
	attrNodeGUID     = 6  // u64, host byte order
	attrSysImageGUID = 7  // u64, host byte order
	attrPortState    = 12 // u8
	attrPhysState    = 13 // u8
	attrNodeType     = 14 // u8
	attrNdevIndex    = 50 // u32
	attrNdevName     = 51 // string
	attrNetnsMode    = 66 // u8 (RDMA_NLDEV_SYS_ATTR_NETNS_MODE)
	attrProtocol     = 67 // string: ib, roce, iw, usnic, opa
	attrNetnsFD      = 68 // u32: RDMA_NLDEV_NET_NS_FD, an fd of the sender's naming a netns
)

// msgType is RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, cmd); replies carry the same type.
func msgType(cmd uint16) uint16 { return clientNLDEV<<10 | cmd }

// NetnsMode is the RDMA subsystem's network namespace mode, as "rdma
// system" shows it.
type NetnsMode uint8

const (
	// NetnsExclusive: each device belongs to one network namespace.
	NetnsExclusive NetnsMode = 0
	// NetnsShared: every namespace sees every device (the default).
	NetnsShared NetnsMode = 1
)

func (m NetnsMode) String() string {
	switch m {
	case NetnsShared:
		return "shared"
	case NetnsExclusive:
		return "exclusive"
	}
	return fmt.Sprintf("NetnsMode(%d)", uint8(m))
}

// Node types (RDMA_NLDEV_ATTR_DEV_NODE_TYPE, the numbers sysfs node_type shows).
const (
	NodeTypeCA   = 1 // RDMA_NODE_IB_CA: InfiniBand and RoCE (rxe)
	NodeTypeRNIC = 4 // RDMA_NODE_RNIC: iWARP (siw)
)

// Device is one RDMA device as RDMA_NLDEV_CMD_GET reports it. The kernel
// reports no network namespace here: in exclusive mode a dump simply lists
// the devices of the caller's namespace.
type Device struct {
	Index        uint32
	Name         string
	NodeType     uint8  // NodeTypeCA, NodeTypeRNIC, ...
	NodeGUID     uint64 // host byte order; FormatGUID prints it as sysfs does
	SysImageGUID uint64
	FWVersion    string // "" when the kernel sends none (rxe, siw)
	Ports        uint32 // number of ports
	Protocol     string // "ib", "roce", "iw", ...; "" from kernels before 5.3
}

// Port is one port of a device as RDMA_NLDEV_CMD_PORT_GET (rdma link)
// reports it.
type Port struct {
	DevIndex  uint32
	DevName   string
	Index     uint32 // 1-based, as in sysfs
	State     uint8  // 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE
	PhysState uint8  // 2 Polling, 3 Disabled, 5 LinkUp, ...
	// NetdevIndex and Netdev name the port's netdev; zero and "" when it
	// has none or when the netdev is in another network namespace (the
	// kernel reports only a netdev of the caller's namespace).
	NetdevIndex uint32
	Netdev      string
}

// System is the subsystem-wide state RDMA_NLDEV_CMD_SYS_GET reports.
type System struct {
	NetnsMode NetnsMode
}

// Error is a failed RDMA netlink operation: the kernel's errno, or a reply
// that could not be decoded.
type Error struct {
	Op  string // "device dump", "port dump of rxe0", "system query", "socket"
	Err error  // a syscall.Errno from the kernel, or a decoding error
	// Route is set on rtnetlink (RouteConn) errors.
	Route bool
}

func (e *Error) Error() string {
	family := "rdma netlink: "
	if e.Route {
		family = "rtnetlink: "
	}
	return family + e.Op + ": " + e.Err.Error()
}
func (e *Error) Unwrap() error { return e.Err }

// errTruncated is a message or attribute that runs past its buffer.
var errTruncated = errors.New("truncated message")

// FormatGUID prints a GUID in host byte order as sysfs prints node_guid:
// "a088:c203:0012:3a40".
func FormatGUID(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", uint16(g>>48), uint16(g>>32), uint16(g>>16), uint16(g))
}
