package hcatest

import (
	"encoding/hex"
	"fmt"
	"strings"
)

// netdev writes a netdev under the HCA's PCI function (or devices/virtual)
// and its class/net link. A software parent shared by several software
// HCAs is written once.
func (b *builder) netdev(pl place, name, address, typ string) {
	d := pl.dev("net", name)
	if b.written[d] {
		return
	}
	b.written[d] = true
	w := b.w
	w.file(d+"/ifindex", fmt.Sprint(b.ifindex))
	b.n.ifindex[name] = b.ifindex
	b.ifindex++
	w.file(d+"/address", address)
	w.file(d+"/type", typ)
	if pl.pci != "" {
		w.link(d+"/device", pl.pci)
	}
	w.link("class/net/"+name, d)
}

// netdevAddress derives a netdev's hardware address from the node GUID, as
// mlx5 and rxe relate them: a MAC with 03:00 (mlx5) or ff:fe (EUI-64, U/L
// bit flipped) inserted, or for IPoIB the QPN followed by the port GID.
func netdevAddress(guid string, k int, ethernet bool) string {
	g, _ := hex.DecodeString(strings.ReplaceAll(guid, ":", ""))
	if len(g) != 8 {
		g = make([]byte, 8)
	}
	var a []byte
	if ethernet {
		a = []byte{g[0], g[1], g[2], g[5], g[6], g[7] + byte(k)}
		if g[3] == 0xff && g[4] == 0xfe {
			a[0] ^= 0x02
		}
	} else {
		a = append([]byte{0x00, 0x00, 0x10, 0x29 + byte(k), 0xfe, 0x80, 0, 0, 0, 0, 0, 0}, g...)
	}
	parts := make([]string, len(a))
	for i, c := range a {
		parts[i] = fmt.Sprintf("%02x", c)
	}
	return strings.Join(parts, ":")
}
