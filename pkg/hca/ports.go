package hca

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

func (p *pass) ports(w warner, ib dir) []Port {
	d := p.openDir(ib, "ports")
	defer p.closeDir(d)
	names, err := p.names(d, "")
	if err != nil {
		w.add(d.path, err)
		return nil
	}
	var ports []Port
	for _, name := range names {
		n, err := strconv.Atoi(name)
		if err != nil || n < 1 {
			continue
		}
		pd := p.openDir(d, name)
		ports = append(ports, p.port(w, pd, n))
		p.closeDir(pd)
	}
	slices.SortFunc(ports, func(a, b Port) int { return a.Number - b.Number })
	return ports
}

// readStates reads a port's state and phys_state ("4: ACTIVE" and
// "5: LinkUp" in sysfs) into their words.
func (p *pass) readStates(w warner, d dir, port *Port) {
	word := func(file string) string {
		s, ok := p.readAttr(w, d, file)
		if !ok {
			return ""
		}
		_, v, err := parseNumberedWord(s)
		if err != nil {
			w.add(d.join(file), err)
		}
		return v
	}
	port.State = word("state")
	port.PhysState = word("phys_state")
}

func (p *pass) port(w warner, dir dir, n int) Port {
	port := Port{Number: n, RoCEv2GIDIndex: -1}
	p.readStates(w, dir, &port)

	if s, ok := p.readAttr(w, dir, "link_layer"); ok {
		switch LinkLayer(s) {
		case LinkLayerInfiniBand, LinkLayerEthernet:
			port.LinkLayer = LinkLayer(s)
		default:
			w.add(dir.join("link_layer"), fmt.Errorf("unknown link layer %q: want InfiniBand or Ethernet", s))
		}
	}
	p.readRateAndLIDs(w, dir, &port)
	port.GIDs = p.gids(w, dir, port.LinkLayer == LinkLayerEthernet)
	port.RoCEv2GIDIndex = roceV2Index(port.GIDs)
	return port
}

// readRateAndLIDs reads a port's rate and, on InfiniBand, its lid and sm_lid
// into port. port.LinkLayer must already be set. A file that cannot be read
// or parsed is reported to w under its path and leaves its fields unchanged.
func (p *pass) readRateAndLIDs(w warner, d dir, port *Port) {
	if s, ok := p.readAttr(w, d, "rate"); ok {
		if r, err := parseRate(s); err != nil {
			w.add(d.join("rate"), err)
		} else {
			port.RateGbps, port.Width, port.Speed = r.gbps, r.width, r.speed
		}
	}
	if port.LinkLayer == LinkLayerInfiniBand {
		for _, f := range []struct {
			file string
			dst  *int
		}{{"lid", &port.LID}, {"sm_lid", &port.SMLID}} {
			if s, ok := p.readAttr(w, d, f.file); ok {
				if v, err := parseHexInt(s, 16); err != nil {
					w.add(d.join(f.file), err)
				} else {
					*f.dst = int(v)
				}
			}
		}
	}
}

// gids reads the occupied slots of a port's GID table. Empty slots are
// skipped before their attributes are read (those reads fail by design).
// Every slot is read: the kernel does not keep the table compact.
func (p *pass) gids(w warner, port dir, ethernet bool) []GID {
	gids := p.openDir(port, "gids")
	defer p.closeDir(gids)
	names, err := p.names(gids, "")
	if err != nil {
		w.add(gids.path, err)
		return nil
	}
	var out []GID
	for _, name := range names {
		idx, err := strconv.Atoi(name)
		if err != nil || idx < 0 {
			continue
		}
		b, err := p.readIn(gids, name)
		if err != nil {
			w.add(gids.join(name), err)
			continue
		}
		// Most slots are empty (rxe has 1024): skip them before any
		// parsing or allocation.
		if isEmptyGID(b) {
			continue
		}
		s := strings.TrimRight(string(b), "\n")
		if _, empty, err := parseGID(s); err != nil {
			w.add(gids.join(name), err)
			continue
		} else if empty {
			continue
		}
		g := GID{Index: idx, GID: s}
		g.Type = p.gidAttr(w, port, "gid_attrs/types/"+name)
		if ethernet {
			g.Netdev = p.gidAttr(w, port, "gid_attrs/ndevs/"+name)
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b GID) int { return a.Index - b.Index })
	return out
}

// emptyGID is an unused GID table slot as sysfs prints it.
const emptyGID = "0000:0000:0000:0000:0000:0000:0000:0000\n"

func isEmptyGID(b []byte) bool { return string(b) == emptyGID }

// gidAttr reads a GID attribute. EINVAL and ENODATA are the kernel's way of
// saying "no value" (no netdev on InfiniBand, a slot being torn down), so
// they are silent.
func (p *pass) gidAttr(w warner, port dir, name string) string {
	s, err := p.readAt(port, name)
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENODATA) || errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	if err != nil {
		w.add(port.join(name), err)
		return ""
	}
	return s
}

// roceV2Index picks the RoCE v2 GID that carries an IP address: the lowest
// IPv4-mapped one, else the lowest global IPv6 one, else -1.
func roceV2Index(gids []GID) int {
	v6 := -1
	for _, g := range gids {
		if g.Type != "RoCE v2" {
			continue
		}
		a, _, err := parseGID(g.GID)
		if err != nil {
			continue
		}
		if a.Is4In6() {
			return g.Index
		}
		if v6 < 0 && !a.IsLinkLocalUnicast() {
			v6 = g.Index
		}
	}
	return v6
}
