package main

import (
	"net"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// unseenNetdevs lists the HCAs' netdevs this process's network namespace
// has no interface for: their link messages and net uevents never reach
// the kernel-event sockets (the daemon is not on the host network).
func unseenNetdevs(inv hca.Inventory) []string {
	var out []string
	for _, h := range inv.HCAs {
		for _, n := range h.Netdevs {
			if _, err := net.InterfaceByName(n); err != nil {
				out = append(out, n)
			}
		}
	}
	return out
}
