// Command rdmactl inspects a node's RDMA devices the way the driver sees
// them, and writes simulated nodes for tests and demos.
//
//	rdmactl simulate --preset dgx-h100 --root /tmp/node
//	rdmactl discover --sysfs-root /tmp/node/sys --dev-root /tmp/node/dev -o table|wide|json|yaml
//	rdmactl discover --netlink=off   # sysfs only, even on this host's /sys
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/rdma-dra/rdma-dra-driver/internal/buildinfo"
	"github.com/rdma-dra/rdma-dra-driver/pkg/devices"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmanl"
)

const usage = `rdmactl: inspect RDMA devices as the rdma.dra.dev driver sees them.

Commands:
  discover   list the node's HCAs (-o table; -o wide adds every field of each and where it lives: slice or
             metadata file), or print the ResourceSlice the driver would publish (-o json|yaml)
  simulate   write a simulated RDMA node (sysfs and /dev) under a directory
  version    print the version, commit and Go version

Run "rdmactl <command> -h" for a command's flags.
`

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "rdmactl:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "discover":
		return discover(args[1:], stdout, stderr)
	case "simulate":
		return simulate(args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "rdmactl", buildinfo.Get())
		return nil
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

func simulate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	preset := fs.String("preset", "dgx-h100", "node preset: "+strings.Join(hcatest.PresetNames(), ", "))
	root := fs.String("root", "", "directory to write sys/ and dev/ under (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *root == "" {
		return errors.New("simulate: --root is required")
	}
	spec, err := hcatest.Preset(*preset)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*root, 0o755); err != nil {
		return err
	}
	node, err := hcatest.Build(*root, spec)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "simulated node %q (%d HCAs): --sysfs-root %s --dev-root %s\n",
		*preset, len(spec.HCAs), node.SysfsRoot, node.DevRoot)
	return nil
}

func discover(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("discover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sysfsRoot := fs.String("sysfs-root", "/sys", "sysfs to read")
	devRoot := fs.String("dev-root", "/dev", "where device nodes live")
	output := fs.String("o", "table", "output: table, wide (the table and every field of each HCA, with where it lives), json or yaml")
	nodeName := fs.String("node-name", "", "node name for the ResourceSlice (default: this host's name)")
	driverName := fs.String("driver-name", "rdma.dra.dev", "DRA driver name (attribute domain)")
	netlink := fs.String("netlink", "auto", "ask the kernel's RDMA netlink for the netns mode and port netdevs: "+
		"auto (when --sysfs-root is /sys), on or off")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var nl hca.Netlink
	switch *netlink {
	case "auto":
		nl = hca.HostNetlink(*sysfsRoot)
	case "on":
		nl = rdmanl.Client{}
	case "off":
	default:
		return fmt.Errorf("unknown --netlink %q: want auto, on or off", *netlink)
	}
	inv, err := hca.Discover(hca.WithSysfsRoot(*sysfsRoot), hca.WithDevRoot(*devRoot), hca.WithNetlink(nl))
	if err != nil {
		return err
	}
	for _, w := range inv.Warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	for _, h := range inv.HCAs {
		for _, w := range h.Warnings {
			fmt.Fprintf(stderr, "warning: %s: %s\n", h.Name, w)
		}
	}
	switch *output {
	case "table":
		return printTable(stdout, inv)
	case "wide":
		if err := printTable(stdout, inv); err != nil {
			return err
		}
		return printFields(stdout, inv, devices.Options{DriverName: *driverName})
	case "json", "yaml":
		name := *nodeName
		if name == "" {
			if name, err = os.Hostname(); err != nil {
				return err
			}
		}
		return printSlices(stdout, *output, devices.ResourceSlices(name, inv, devices.Options{DriverName: *driverName}))
	}
	return fmt.Errorf("unknown output %q: want table, wide, json or yaml", *output)
}

func printTable(w io.Writer, inv hca.Inventory) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tIBDEV\tMODEL\tLINK\tRATE\tSTATE\tNUMA\tPCIE-ROOT\tNETDEV\tUVERBS")
	var unusable []string
	for _, h := range inv.HCAs {
		if !h.Usable {
			unusable = append(unusable, fmt.Sprintf("%s: not usable: %s", h.Name, h.UnusableReason))
		}
		link, rate, state := "-", "-", "-"
		if len(h.Ports) > 0 {
			p := h.Ports[0]
			link, state = orDash(string(p.LinkLayer)), orDash(p.State)
			if p.RateGbps > 0 {
				rate = fmt.Sprintf("%g Gb/s", p.RateGbps)
			}
		}
		numa, root := "-", "-"
		if h.PCI != nil {
			if h.PCI.NUMANode >= 0 {
				numa = fmt.Sprint(h.PCI.NUMANode)
			}
			root = orDash(h.PCI.PCIeRoot)
			if h.DataPath != nil && h.DataPath.PCIeRoot != "" {
				root = h.DataPath.PCIeRoot // what the slice publishes
			}
		}
		netdev := "-"
		if len(h.Netdevs) > 0 {
			netdev = strings.Join(h.Netdevs, ",")
		}
		uverbs := "-"
		if h.Uverbs != nil {
			uverbs = h.Uverbs.Name
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", devices.DeviceName(h.Name), h.Name,
			orDash(h.Model), link, rate, state, numa, root, netdev, uverbs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(inv.HCAs) == 0 {
		fmt.Fprintln(w, "no RDMA devices found")
	}
	for _, u := range unusable {
		fmt.Fprintln(w, u)
	}
	fmt.Fprintln(w, netnsLine(inv))
	return nil
}

// printFields prints every field the driver knows of each published HCA,
// as its metadata file has them, and where each lives: "slice" (the
// ResourceSlice, for selectors, and the metadata file) or "metadata" (the
// metadata file only). docs/attributes.md says why.
func printFields(w io.Writer, inv hca.Inventory, opts devices.Options) error {
	pub := devices.Published(inv)
	taints := map[string][]resourceapi.DeviceTaint{}
	for _, d := range devices.Devices(inv, opts) {
		taints[d.Name] = d.Taints
	}
	for _, name := range sortedNames(pub) {
		h := pub[name]
		fmt.Fprintf(w, "\n%s (%s)\n", name, h.Name)
		tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
		fmt.Fprintln(tw, "  FIELD\tVALUE\tWHERE")
		fields := devices.Metadata(h, inv.NetnsMode, "", opts)
		keys := make([]string, 0, len(fields))
		for k := range fields {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			where := "metadata"
			if devices.InSlice(k, opts) {
				where = "slice"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", k, devices.AttributeString(fields[k]), where)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		printDataPath(w, h)
		for _, t := range taints[name] {
			fmt.Fprintf(w, "  taint: %s=%s:%s%s\n", t.Key, t.Value, t.Effect, taintMeaning(t.Key, opts))
		}
	}
	return nil
}

// printDataPath says where the HCA's GPU peer-to-peer DMA enters it, the
// GPUs near, the card, the ACS of the shared switch and the verdict.
func printDataPath(w io.Writer, h hca.HCA) {
	dp := h.DataPath
	if dp == nil {
		return
	}
	fn := dp.Function + " (its own function)"
	if dp.DataDirect {
		fn = fmt.Sprintf("%s (the Data Direct DMA function of %s's card)", dp.Function, h.PCI.BusID)
	}
	fmt.Fprintf(w, "  data path: %s, root %s\n", fn, dp.PCIeRoot)
	switch dp.GPULink {
	case hca.GPULinkSwitch:
		fmt.Fprintf(w, "  GPUs: %s (under the switch at %s)\n", strings.Join(dp.GPUs, ", "), dp.Shared)
	case hca.GPULinkRootComplex:
		fmt.Fprintf(w, "  GPUs: %s (the same root complex, no switch in common)\n", strings.Join(dp.GPUs, ", "))
	case hca.GPULinkNUMA:
		fmt.Fprintf(w, "  GPUs: %s (the same NUMA node, no PCIe in common)\n", strings.Join(dp.GPUs, ", "))
	default:
		fmt.Fprintln(w, "  GPUs: none near")
	}
	if dp.Board != "" || dp.Product != "" {
		fmt.Fprintf(w, "  board: %s (%s)\n", orDash(dp.Board), orDash(dp.Product))
	}
	for _, a := range dp.ACS {
		fmt.Fprintf(w, "  switch port %s\n", a)
	}
	switch dp.GPUDirect {
	case hca.GPUDirectReady:
		fmt.Fprintln(w, "  GPUDirect: ready (peer-to-peer turns in the switch)")
	case hca.GPUDirectNotReady, hca.GPUDirectUnknown:
		fmt.Fprintf(w, "  GPUDirect: %s (%s): %s\n", dp.GPUDirect, dp.GPUDirectCause, dp.GPUDirectReason)
	}
}

// taintMeaning is what a taint tells an admin.
func taintMeaning(key string, opts devices.Options) string {
	driver := opts.DriverName
	if driver == "" {
		driver = devices.DefaultDriverName
	}
	if key == driver+"/"+devices.TaintGPUDirectNotReady {
		return " (the HCA works; GPUDirect RDMA through it does not turn in the switch: new claims avoid it unless they tolerate the taint)"
	}
	return ""
}

func sortedNames(m map[string]hca.HCA) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// netnsLine says the RDMA netns mode and where it was read.
func netnsLine(inv hca.Inventory) string {
	switch inv.NetnsModeSource {
	case hca.SourceNetlink:
		return fmt.Sprintf("RDMA netns mode: %s (RDMA netlink)", inv.NetnsMode)
	case hca.SourceSysfs:
		return fmt.Sprintf("RDMA netns mode: %s (module/ib_core/parameters/netns_mode)", inv.NetnsMode)
	}
	return "RDMA netns mode: unknown (no RDMA netlink answer, no ib_core module parameter)"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printSlices prints one ResourceSlice as itself and several as a List, as
// kubectl does.
func printSlices(w io.Writer, format string, rs []resourceapi.ResourceSlice) error {
	var obj any = map[string]any{"apiVersion": "v1", "kind": "List", "items": rs}
	if len(rs) == 1 {
		obj = rs[0]
	}
	var b []byte
	var err error
	if format == "json" {
		b, err = json.MarshalIndent(obj, "", "  ")
		b = append(b, '\n')
	} else {
		b, err = yaml.Marshal(obj)
	}
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
