package cdi

import (
	"strconv"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// Hand-built HCAs, numbered as a real node numbers them.

var rdmaCM = &hca.CharDevice{Name: "rdma_cm", Path: "/dev/infiniband/rdma_cm", Major: 10, Minor: 58, Exists: true}

func chardev(name string, major, minor uint32, port int) hca.CharDevice {
	return hca.CharDevice{Name: name, Path: "/dev/infiniband/" + name, Major: major, Minor: minor, Port: port, Exists: true}
}

// ibHCA is an InfiniBand HCA with one ACTIVE port and its MAD devices.
func ibHCA(n uint32) hca.HCA {
	name := "mlx5_" + itoa(n)
	uverbs := chardev("uverbs"+itoa(n), 231, 192+n, 0)
	return hca.HCA{Identity: hca.Identity{NodeType: "CA"},
		Name: name,

		Ports:  []hca.Port{{Number: 1, State: "ACTIVE", LinkLayer: hca.LinkLayerInfiniBand, RoCEv2GIDIndex: -1}},
		Uverbs: &uverbs,
		MAD:    []hca.CharDevice{chardev("issm"+itoa(n), 231, 64+n, 1), chardev("umad"+itoa(n), 231, n, 1)},
		Usable: true,
	}
}

// roceHCA is a RoCE HCA whose ports have the given states and RoCE v2 GID
// indexes.
func roceHCA(n uint32, ports ...hca.Port) hca.HCA {
	h := ibHCA(n)
	for i := range ports {
		ports[i].Number = i + 1
		ports[i].LinkLayer = hca.LinkLayerEthernet
	}
	h.Ports = ports
	return h
}

func active(gid int) hca.Port { return hca.Port{State: "ACTIVE", RoCEv2GIDIndex: gid} }
func down(gid int) hca.Port   { return hca.Port{State: "DOWN", RoCEv2GIDIndex: gid} }

func itoa(n uint32) string { return strconv.Itoa(int(n)) }
