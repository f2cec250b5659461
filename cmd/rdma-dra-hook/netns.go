package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
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
	// netdev reports whether a netdev is in one namespace.
	netdev(s side, name string) (bool, error)
	// moveNetdev moves a netdev of the host's namespace to the container's.
	moveNetdev(name string) error
	close() error
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func netns(args []string, stdin io.Reader, open func(pid int) (netnsKernel, error)) error {
	fs := flag.NewFlagSet("netns", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	device := fs.String("device", "", "ibdev")
	var netdevs stringList
	fs.Var(&netdevs, "netdev", "netdev to move with the device (repeatable)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("netns: unexpected arguments %q", fs.Args())
	}
	if *device == "" || strings.ContainsAny(*device, " \t\n/") || len(*device) > 63 {
		return fmt.Errorf("netns: --device: RDMA device name %q is not a kernel device name", *device)
	}
	for _, nd := range netdevs {
		if nd == "" || strings.ContainsAny(nd, " \t\n/:") || len(nd) > 15 {
			return fmt.Errorf("netns: --netdev: %q is not a netdev name", nd)
		}
	}
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

	// The RDMA device first: if the kernel cannot move it, nothing moved.
	dev, inHost, err := k.rdmaDevice(host, hca)
	if err != nil {
		return fmt.Errorf("HCA %s: looking for it in the host's network namespace: %w", hca, err)
	}
	if inHost {
		if err := k.moveRDMA(dev); err != nil {
			return fmt.Errorf("HCA %s: cannot move it into %s: %w%s", hca, where, err, moveHint(err))
		}
	} else if err := inContainer(hca, "RDMA device", where, func(s side) (bool, error) {
		_, ok, err := k.rdmaDevice(s, hca)
		return ok, err
	}); err != nil {
		return err
	}
	for _, nd := range netdevs {
		inHost, err := k.netdev(host, nd)
		if err != nil {
			return fmt.Errorf("HCA %s: looking for netdev %s in the host's network namespace: %w", hca, nd, err)
		}
		if !inHost {
			if err := inContainer(hca, "netdev "+nd, where, func(s side) (bool, error) { return k.netdev(s, nd) }); err != nil {
				return err
			}
			continue
		}
		if err := k.moveNetdev(nd); err != nil {
			return fmt.Errorf("HCA %s: cannot move its netdev %s into %s: %w", hca, nd, where, err)
		}
	}
	return nil
}

// inContainer succeeds when what is not in the host's namespace is in the
// container's already (another container of the pod moved it).
func inContainer(hca, what, where string, present func(side) (bool, error)) error {
	ok, err := present(container)
	if err != nil {
		return fmt.Errorf("HCA %s: looking for %s in %s: %w", hca, what, where, err)
	}
	if !ok {
		return fmt.Errorf("HCA %s: %s is in neither the host's network namespace nor %s: "+
			"another pod's network namespace holds it, or it is gone", hca, what, where)
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
