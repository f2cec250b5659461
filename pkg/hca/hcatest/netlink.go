package hcatest

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// Netlink answers RDMA netlink queries for the simulated node as the
// kernel would for this spec: what rdmanl.Client reports on a real node.
// It reads the node's Spec at each call, so mutations (SetPortState,
// RenameNetdev, RemoveHCA) show. The real socket path is proven on a real
// kernel (test/vm); this stands in for it where the hardware is simulated.
type Netlink struct {
	n *Node
	// Err, when set, fails every query (a kernel refusing, say
	// &rdmanl.Error{Op: "system query", Err: syscall.EOPNOTSUPP}).
	Err error
}

// Netlink returns the node's simulated RDMA netlink.
func (n *Node) Netlink() *Netlink { return &Netlink{n: n} }

// NetnsMode is Spec.NetnsShared, as "rdma system" shows it.
func (f *Netlink) NetnsMode() (rdmanl.NetnsMode, error) {
	if f.Err != nil {
		return 0, f.Err
	}
	if f.n.Spec.NetnsShared {
		return rdmanl.NetnsShared, nil
	}
	return rdmanl.NetnsExclusive, nil
}

// Links lists every port of every device of the caller's namespace, as
// "rdma link" does. Device indexes follow the spec's order. A port's
// netdev is the parent of a software device and the netdev of an
// Ethernet port's function; InfiniBand ports have none (IPoIB is not bound
// through ib_device_set_netdev). From a foreign namespace (Spec.ForeignNetns)
// an exclusive-mode kernel lists no device, a shared-mode one lists them
// without netdevs (those are in the initial namespace).
func (f *Netlink) Links() ([]rdmanl.Port, error) {
	if f.Err != nil {
		return nil, f.Err
	}
	s := f.n.Spec
	if s.ForeignNetns && !s.NetnsShared {
		return nil, nil
	}
	var out []rdmanl.Port
	for i, h := range s.HCAs {
		for j, p := range h.Ports {
			l := rdmanl.Port{DevIndex: uint32(i), DevName: h.Name, Index: uint32(j + 1)}
			var err error
			if l.State, err = stateNumber(p.State); err != nil {
				return nil, fmt.Errorf("hcatest: %s port %d state: %w", h.Name, j+1, err)
			}
			if l.PhysState, err = stateNumber(p.PhysState); err != nil {
				return nil, fmt.Errorf("hcatest: %s port %d phys_state: %w", h.Name, j+1, err)
			}
			if nd := portNetdev(h, j); nd != "" && !s.ForeignNetns {
				l.Netdev, l.NetdevIndex = nd, uint32(f.n.ifindex[nd])
			}
			out = append(out, l)
		}
	}
	return out, nil
}

func portNetdev(h HCASpec, port int) string {
	if len(h.Netdevs) == 0 {
		return ""
	}
	if h.PCI == nil {
		return h.Netdevs[0]
	}
	if h.Ports[port].LinkLayer != eth {
		return ""
	}
	return h.Netdevs[min(port, len(h.Netdevs)-1)]
}

// stateNumber is the number of "4: ACTIVE".
func stateNumber(s string) (uint8, error) {
	num, _, _ := strings.Cut(s, ":")
	n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 8)
	if err != nil {
		return 0, fmt.Errorf("cannot parse %q", s)
	}
	return uint8(n), nil
}
