package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"syscall"

	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

// side is one of the two network namespaces the netns command looks at.
type side int

const (
	host      side = iota // the hook's own: the runtime's, the initial one
	container             // the container's
)

func (s side) String() string {
	if s == host {
		return "the host's"
	}
	return "the container's"
}

// netnsKernel is what the netns command asks of the kernel about one
// container's network namespace. hostNetns is the real one; tests use a
// fake where this host has no RDMA netlink.
type netnsKernel interface {
	// sameNetns reports whether the container shares the hook's namespace.
	sameNetns() (bool, error)
	// rdmaDevice finds an RDMA device in one namespace.
	rdmaDevice(s side, name string) (rdmanl.Device, bool, error)
	// moveRDMA moves a device of the host's namespace to the container's.
	moveRDMA(dev rdmanl.Device) error
	// ports lists dev's ports as seen from one namespace: a port names its
	// netdev (by ifindex) only when the netdev is in that namespace.
	ports(s side, dev rdmanl.Device) ([]rdmanl.Port, error)
	// hostLinks lists the netdevs of the host's namespace: IPoIB netdevs
	// by the device under them, what is stacked on a netdev, and an old
	// spec's names (checked, never used to choose what moves).
	hostLinks() ([]rdmanl.Link, error)
	// parentDevice is the device under an RDMA device of the host's
	// namespace ("0000:17:00.0"), "" for a software one.
	parentDevice(ibdev string) (string, error)
	// nodeUse says why the node needs the host's netdev index ("" if not).
	nodeUse(index int, nodeIPs []netip.Addr) (string, error)
	// moveLink moves the host's netdev index to the container's.
	moveLink(index int) error
	close() error
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// link is one netdev of the HCA, by identity: a port's, or (IPoIB) one
// on the HCA's PCI function.
type link struct {
	port   uint32
	parent string
	index  int
	name   string // as the kernel named it just now, for messages
}

func (l link) String() string {
	if l.port == 0 {
		return fmt.Sprintf("%s (ifindex %d, on %s)", l.name, l.index, l.parent)
	}
	return fmt.Sprintf("%s (ifindex %d, port %d)", l.name, l.index, l.port)
}

func netns(args []string, stdin io.Reader, open func(pid int) (netnsKernel, error), log io.Writer) error {
	fs := flag.NewFlagSet("netns", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	device := fs.String("device", "", "ibdev")
	moveNetdevs := fs.Bool("move-netdevs", false, "move the netdevs of the device's ports too, found by identity")
	var oldNames, ipArgs stringList
	fs.Var(&oldNames, "netdev", "a netdev name from a spec written by an older driver (repeatable): implies --move-netdevs, checked against the kernel")
	fs.Var(&ipArgs, "node-ip", "the node's InternalIP (repeatable): a netdev holding it never moves")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("netns: unexpected arguments %q", fs.Args())
	}
	if *device == "" || strings.ContainsAny(*device, " \t\n/") || len(*device) > 63 {
		return fmt.Errorf("netns: --device: RDMA device name %q is not a kernel device name", *device)
	}
	for _, nd := range oldNames {
		if nd == "" || strings.ContainsAny(nd, " \t\n/:") || len(nd) > 15 {
			return fmt.Errorf("netns: --netdev: %q is not a netdev name", nd)
		}
	}
	var nodeIPs []netip.Addr
	for _, v := range ipArgs {
		ip, err := netip.ParseAddr(v)
		if err != nil {
			return fmt.Errorf("netns: --node-ip: %w", err)
		}
		nodeIPs = append(nodeIPs, ip)
	}
	moving := *moveNetdevs || len(oldNames) > 0
	hca := *device
	st, err := readState(stdin)
	if err != nil {
		return fmt.Errorf("HCA %s: %w", hca, err)
	}
	where := fmt.Sprintf("the network namespace of container %s (pid %d)", st.ID, st.Pid)
	k, err := open(st.Pid)
	if err != nil {
		return fmt.Errorf("HCA %s: cannot open %s: %w", hca, where, err)
	}
	defer k.close()
	same, err := k.sameNetns()
	if err != nil {
		return fmt.Errorf("HCA %s: %w", hca, err)
	}
	if same {
		return nil // a hostNetwork container already sees the host's devices
	}

	dev, inHost, err := k.rdmaDevice(host, hca)
	if err != nil {
		return fmt.Errorf("HCA %s: looking for it in the host's network namespace: %w", hca, err)
	}
	if !inHost {
		// Another container of the pod moved it, with its netdevs.
		var inCtr bool
		dev, inCtr, err = k.rdmaDevice(container, hca)
		if err != nil {
			return fmt.Errorf("HCA %s: looking for RDMA device in %s: %w", hca, where, err)
		}
		if !inCtr {
			return fmt.Errorf("HCA %s: RDMA device is in neither the host's network namespace nor %s: "+
				"another pod's network namespace holds it, or it is gone", hca, where)
		}
		if !moving {
			return nil
		}
		// Nothing moves here; a RoCE port's netdev must have come along.
		_, err := hcaLinks(k, container, dev, where, nil)
		return err
	}

	// Everything is checked before anything moves: the netdevs are the
	// kernel's answer for the HCA now, by ifindex.
	var links []link
	if moving {
		all, err := k.hostLinks()
		if err != nil {
			return fmt.Errorf("HCA %s: listing the host's netdevs: %w", hca, err)
		}
		if links, err = hcaLinks(k, host, dev, where, all); err != nil {
			return err
		}
		if err := checkOldNames(dev, links, oldNames, all, log); err != nil {
			return err
		}
		for _, l := range links {
			if err := checkNodeUse(k, hca, l, all, nodeIPs, where); err != nil {
				return err
			}
		}
	}
	// The RDMA device first: if the kernel cannot move it, nothing moved.
	if err := k.moveRDMA(dev); err != nil {
		return fmt.Errorf("HCA %s: cannot move it into %s: %w%s", hca, where, err, moveHint(err))
	}
	for _, l := range links {
		if err := k.moveLink(l.index); err != nil {
			return fmt.Errorf("HCA %s: cannot move its netdev %s into %s: %w", hca, l, where, err)
		}
		fmt.Fprintf(log, "rdma-dra-hook: HCA %s: moved its netdev %s into %s\n", hca, l, where)
	}
	return nil
}

// hcaLinks lists dev's netdevs as the kernel reports them in s, where dev
// is: each port's (RDMA netlink names it by ifindex), and on InfiniBand
// the IPoIB netdevs on the same PCI function (all, the host's links). A
// RoCE or iWARP port always has one: one that is not in s is in some
// other namespace, and the move fails closed rather than leave the
// container without it.
func hcaLinks(k netnsKernel, s side, dev rdmanl.Device, where string, all []rdmanl.Link) ([]link, error) {
	ports, err := k.ports(s, dev)
	if err != nil {
		return nil, fmt.Errorf("HCA %s: reading its ports' netdevs in %s: %w", dev.Name, sideName(s, where), err)
	}
	var out []link
	for _, p := range ports {
		if p.NetdevIndex == 0 {
			if dev.Protocol == "roce" || dev.Protocol == "iw" {
				return nil, fmt.Errorf("HCA %s: port %d is %s but the kernel reports no netdev for it in %s: "+
					"another network namespace holds it (an earlier start moved the HCA but not its netdev?); "+
					"delete the pod so the HCA and its netdev return to the host", dev.Name, p.Index, dev.Protocol, sideName(s, where))
			}
			continue // InfiniBand: no netdev of the port's own
		}
		out = append(out, link{port: p.Index, index: int(p.NetdevIndex), name: p.Netdev})
	}
	if s != host || dev.Protocol != "ib" {
		return out, nil
	}
	parent, err := k.parentDevice(dev.Name)
	if err != nil {
		return nil, fmt.Errorf("HCA %s: finding its IPoIB netdevs: %w", dev.Name, err)
	}
	if parent == "" {
		return out, nil
	}
	if !slices.ContainsFunc(all, func(l rdmanl.Link) bool { return l.Parent != "" }) {
		return nil, fmt.Errorf("HCA %s: this kernel names no netdev's parent device (IFLA_PARENT_DEV_NAME; Linux 6.1 does), "+
			"so its IPoIB netdevs cannot be told by identity; refusing to move them by name", dev.Name)
	}
	for _, l := range all {
		if l.Parent == parent && !slices.ContainsFunc(out, func(o link) bool { return o.index == l.Index }) {
			out = append(out, link{parent: parent, index: l.Index, name: l.Name})
		}
	}
	return out, nil
}

// checkNodeUse refuses to move l when the node's own traffic needs it or
// a netdev stacked on it (a VLAN, an IPoIB child, the bond it is in),
// which the move would take down with it.
func checkNodeUse(k netnsKernel, hca string, l link, all []rdmanl.Link, nodeIPs []netip.Addr, where string) error {
	type candidate struct {
		index int
		what  string
	}
	check := []candidate{{l.index, "it"}}
	for _, o := range all {
		if o.Lower == l.index && o.Index != l.index {
			check = append(check, candidate{o.Index, fmt.Sprintf("%s (ifindex %d), stacked on it,", o.Name, o.Index)})
		}
		if o.Index == l.index && o.Master > 0 {
			check = append(check, candidate{o.Master, fmt.Sprintf("ifindex %d, its master,", o.Master)})
		}
	}
	for _, c := range check {
		why, err := k.nodeUse(c.index, nodeIPs)
		if err != nil {
			return fmt.Errorf("HCA %s: checking whether the node needs its netdev %s: %w", hca, l, err)
		}
		if why != "" {
			return fmt.Errorf("HCA %s: refusing to move its netdev %s into %s: %s %s; "+
				"moveNetdev must not be granted for this HCA (its DeviceClass)", hca, l, where, c.what, why)
		}
	}
	return nil
}

func sideName(s side, where string) string {
	if s == host {
		return "the host's network namespace"
	}
	return where
}

// checkOldNames checks the names a spec of an older driver carries
// (--netdev) against the HCA's netdevs now. A name that is one of them,
// or that names no netdev at all (the HCA's was renamed), is fine: the
// move is by identity either way. A name that now belongs to another
// netdev is refused: the spec and the kernel disagree on what it meant.
func checkOldNames(dev rdmanl.Device, links []link, names []string, all []rdmanl.Link, log io.Writer) error {
	current := make([]string, 0, len(links))
	for _, l := range links {
		current = append(current, l.String())
	}
	now := strings.Join(current, ", ")
	if now == "" {
		now = "none"
	}
	for _, name := range names {
		if slices.ContainsFunc(links, func(l link) bool { return l.name == name }) {
			continue
		}
		if i := slices.IndexFunc(all, func(l rdmanl.Link) bool { return l.Name == name }); i >= 0 {
			index := all[i].Index
			return fmt.Errorf("HCA %s: its CDI spec (written at prepare) names netdev %s, but that name is now ifindex %d, "+
				"which the kernel does not name as the HCA's; the HCA's netdevs now: %s; refusing to move anything: delete the pod so the claim is prepared again",
				dev.Name, name, index, now)
		}
		fmt.Fprintf(log, "rdma-dra-hook: HCA %s: netdev %s, named by its CDI spec, is gone; the HCA's netdevs now: %s (renamed since prepare)\n",
			dev.Name, name, now)
	}
	return nil
}

// moveHint explains the kernel's usual refusals.
func moveHint(err error) string {
	switch {
	case errors.Is(err, syscall.EOPNOTSUPP):
		return " (the kernel moves only devices whose driver can disassociate its users, such as mlx5, not rxe or siw, " +
			"and only in exclusive netns mode: see \"rdma system\")"
	case errors.Is(err, syscall.EPERM):
		return " (moving needs CAP_NET_ADMIN over the target namespace)"
	}
	return ""
}
