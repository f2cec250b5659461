package hca

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Problem says why an HCA cannot carry traffic, or "" when every port is
// ACTIVE with its link up. A claim gets the whole HCA, so one bad port
// makes the HCA unhealthy.
func (h HCA) Problem() string {
	if !h.Usable {
		return h.UnusableReason
	}
	for _, p := range h.Ports {
		if p.State != "ACTIVE" || (p.PhysState != "" && p.PhysState != "LinkUp") {
			return fmt.Sprintf("port %d is %s (%s)", p.Number, orUnknown(p.State), orUnknown(p.PhysState))
		}
	}
	return ""
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// PortStates reads only the state files of every port: the cheap check a
// watcher can run several times a second to notice a link change without a
// full discovery. Keys are "<ibdev>/<port>", values the raw state and
// phys_state contents.
//
// On Linux the state files stay open between calls (two descriptors per
// port) and are re-read in place; see portWatch.
func (d *Discoverer) PortStates() (map[string]string, error) {
	if m, ok, err := d.portStates(); ok {
		return m, err
	}
	root := filepath.Join(d.sysfsRoot, "class", "infiniband")
	ibdevs, err := os.ReadDir(root)
	if os.IsNotExist(err) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(ibdevs))
	for _, ib := range ibdevs {
		portsDir := filepath.Join(root, ib.Name(), "ports")
		ports, err := os.ReadDir(portsDir)
		if err != nil {
			out[ib.Name()] = "unreadable"
			continue
		}
		for _, p := range ports {
			var b strings.Builder
			for _, f := range []string{"state", "phys_state"} {
				v, _ := d.readFile(filepath.Join(portsDir, p.Name(), f))
				b.Write(v)
			}
			out[ib.Name()+"/"+p.Name()] = b.String()
		}
	}
	return out, nil
}
