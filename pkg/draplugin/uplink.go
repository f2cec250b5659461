package draplugin

// moveNetdev never takes the node's own uplink: a netdev that carries the
// host's default route or holds the Node's InternalIP stays, checked at
// prepare (here, by the names discovery lists) and again by the hook when
// it moves (by ifindex). Without the check a class that grants moveNetdev
// on the wrong HCA cuts the node off when the first pod starts.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// NodeGetter reads the InternalIPs from the Node object: a GET each time,
// made only for claims whose netdevs move (rare), so an address changed
// since the daemon started is seen.
type NodeGetter struct {
	Nodes corev1client.NodeInterface
	Name  string
}

// InternalIPs lists the Node's status.addresses of type InternalIP.
func (g NodeGetter) InternalIPs(ctx context.Context) ([]netip.Addr, error) {
	node, err := g.Nodes.Get(ctx, g.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading Node %s for its InternalIP: %w", g.Name, err)
	}
	var out []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			return nil, fmt.Errorf("status.addresses of Node %s: InternalIP %q: %w", g.Name, a.Address, err)
		}
		out = append(out, ip.Unmap())
	}
	return out, nil
}

// netdevUse checks the netdevs of h before a claim may move them, and
// remembers the InternalIPs for the hook's own check.
func (f *factReader) netdevUse(ctx context.Context, h hca.HCA) error {
	if f.hostLinks == nil || f.nodeIPs == nil {
		return fmt.Errorf("HCA %s: moveNetdev needs the driver to check that none of its netdevs (%v) carries the node's default route "+
			"or holds its InternalIP, and this driver cannot read the host's routes or the Node", h.Name, h.Netdevs)
	}
	ips, err := f.nodeIPs.InternalIPs(ctx)
	if err != nil {
		return fmt.Errorf("HCA %s: cannot check its netdevs before moving them (moveNetdev): %w", h.Name, err)
	}
	f.ips.set(ips)
	for _, nd := range h.Netdevs {
		why, err := f.hostLinks.NetdevUse(nd, ips)
		if err != nil {
			return fmt.Errorf("HCA %s: cannot check its netdev %s before moving it (moveNetdev): %w", h.Name, nd, err)
		}
		if why != "" {
			return fmt.Errorf("refusing to move netdev %s of HCA %s into the pod (moveNetdev): it %s; "+
				"grant moveNetdev only in a DeviceClass whose HCAs do not carry the node's own traffic", nd, h.Name, why)
		}
	}
	return nil
}

// readNodeIPs reads the InternalIPs once at start, for specs rewritten
// before any prepare checks them again.
func (f *factReader) readNodeIPs(ctx context.Context) error {
	if f.nodeIPs == nil {
		return nil
	}
	ips, err := f.nodeIPs.InternalIPs(ctx)
	if err != nil {
		return err
	}
	f.ips.set(ips)
	return nil
}

// nodeIPCache holds the Node's InternalIPs as last read (at start, and at
// each prepare that moves netdevs), for the hook's --node-ip.
type nodeIPCache struct {
	mu  sync.Mutex
	ips []netip.Addr
}

func (c *nodeIPCache) set(ips []netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ips = ips
}

// args are the InternalIPs as the hook's arguments, sorted.
func (c *nodeIPCache) args() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.ips))
	for _, ip := range c.ips {
		out = append(out, ip.String())
	}
	slices.Sort(out)
	return out
}

var errNoUplinkFacts = errors.New("the HCA changed while the prepare checked its netdevs; the kubelet retries the prepare")
