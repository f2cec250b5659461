package hca

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// NetdevAddress is what sysfs says of one netdev.
type NetdevAddress struct {
	Name string
	// HardwareAddress as the kernel prints it: a MAC (6 bytes) on Ethernet,
	// 20 bytes on IPoIB.
	HardwareAddress string
	// Ifindex in the netdev's own network namespace.
	Ifindex int
}

// Netdev reads class/net/<name>/address and ifindex. Discovery does not: a
// prepared claim's status names its netdev, read once per prepare. The
// class lists the netdevs of the namespace that mounted sysfs (the host's
// for a host mount), whatever the reader's.
func (d *Discoverer) Netdev(name string) (NetdevAddress, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return NetdevAddress{}, fmt.Errorf("netdev %q: not a netdev name", name)
	}
	dir := filepath.Join(d.sysfsRoot, "class", "net", name)
	out := NetdevAddress{Name: name}
	b, err := d.readFile(filepath.Join(dir, "address"))
	if err != nil {
		return out, fmt.Errorf("netdev %s: %w", name, err)
	}
	out.HardwareAddress = strings.TrimSpace(string(b))
	b, err = d.readFile(filepath.Join(dir, "ifindex"))
	if err != nil {
		return out, fmt.Errorf("netdev %s: %w", name, err)
	}
	if out.Ifindex, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return out, fmt.Errorf("netdev %s: %s: %w", name, filepath.Join(dir, "ifindex"), err)
	}
	return out, nil
}
