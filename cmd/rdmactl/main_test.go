package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

func rdmactl(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(args, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestSimulateThenDiscover(t *testing.T) {
	root := filepath.Join(t.TempDir(), "node")
	if _, _, err := rdmactl(t, "simulate", "--preset", "dgx-h100", "--root", root); err != nil {
		t.Fatal(err)
	}
	sysfs, dev := "--sysfs-root="+root+"/sys", "--dev-root="+root+"/dev"

	table, warnings, err := rdmactl(t, "discover", sysfs, dev)
	if err != nil || warnings != "" {
		t.Fatalf("discover: %v, stderr %q", err, warnings)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 12 {
		t.Fatalf("table has %d lines, want header + 10 HCAs + netns mode:\n%s", len(lines), table)
	}
	if want := "RDMA netns mode: shared (module/ib_core/parameters/netns_mode)"; lines[11] != want {
		t.Errorf("last line = %q, want %q", lines[11], want)
	}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "NAME IBDEV MODEL LINK RATE STATE NUMA PCIE-ROOT NETDEV UVERBS" {
		t.Errorf("header = %q", lines[0])
	}
	wantRows := map[int]string{
		1:  "mlx5-0 mlx5_0 ConnectX-7 InfiniBand 400 Gb/s ACTIVE 0 pci0000:15 ibp22s0 uverbs0",
		8:  "mlx5-7 mlx5_7 ConnectX-7 InfiniBand 400 Gb/s ACTIVE 1 pci0000:c0 ibp194s0 uverbs7",
		10: "mlx5-9 mlx5_9 BlueField-3 Ethernet 200 Gb/s ACTIVE 1 pci0000:d0 ens1f1np1 uverbs9",
	}
	for i, want := range wantRows {
		if got := strings.Join(strings.Fields(lines[i]), " "); got != want {
			t.Errorf("row %d = %q, want %q", i, got, want)
		}
	}

	for _, format := range []string{"yaml", "json"} {
		out, _, err := rdmactl(t, "discover", sysfs, dev, "--node-name=dgx01", "-o", format)
		if err != nil {
			t.Fatal(err)
		}
		var s resourceapi.ResourceSlice
		if format == "yaml" {
			err = yaml.UnmarshalStrict([]byte(out), &s)
		} else {
			err = json.Unmarshal([]byte(out), &s)
		}
		if err != nil {
			t.Fatalf("-o %s is not a ResourceSlice: %v\n%s", format, err, out)
		}
		if s.Kind != "ResourceSlice" || s.APIVersion != "resource.k8s.io/v1" || s.Spec.Driver != "rdma.dra.dev" ||
			s.Spec.Pool.Name != "dgx01" || len(s.Spec.Devices) != 10 {
			t.Errorf("-o %s: %s %s driver %s pool %s, %d devices", format, s.APIVersion, s.Kind, s.Spec.Driver, s.Spec.Pool.Name, len(s.Spec.Devices))
		}
	}
}

func TestDiscoverBrokenNodeWarns(t *testing.T) {
	root := filepath.Join(t.TempDir(), "node")
	if _, _, err := rdmactl(t, "simulate", "--preset", "broken", "--root", root); err != nil {
		t.Fatal(err)
	}
	table, warnings, err := rdmactl(t, "discover", "--sysfs-root", root+"/sys", "--dev-root", root+"/dev")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(warnings, "ports/1/rate: cannot parse \"fast\"") {
		t.Errorf("stderr does not name the garbled rate file:\n%s", warnings)
	}
	if !strings.Contains(table, "mlx5_4: not usable: no uverbs device") {
		t.Errorf("table does not say why mlx5_4 is unusable:\n%s", table)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command given"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"simulate"}, "--root is required"},
		{[]string{"simulate", "--preset", "nope", "--root", t.TempDir()}, "nope"},
		{[]string{"discover", "--sysfs-root", t.TempDir(), "-o", "xml"}, `unknown output "xml"`},
		{[]string{"discover", "--sysfs-root", t.TempDir(), "--netlink", "maybe"}, `unknown --netlink "maybe"`},
	} {
		if _, _, err := rdmactl(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rdmactl %v: err %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestDiscoverSoftRoCE: the test/vm guest's layouts; a simulated tree is
// never mixed with this host's RDMA netlink unless asked (--netlink=on).
func TestDiscoverSoftRoCE(t *testing.T) {
	for _, tc := range []struct {
		preset, row string
	}{
		{"rxe", "rxe0 rxe0 Soft-RoCE Ethernet 2.5 Gb/s ACTIVE - - eth0 uverbs0"},
		{"siw", "siw0 siw0 soft-iWARP Ethernet 2.5 Gb/s ACTIVE - - - uverbs0"}, // its netdev is in RDMA netlink only
	} {
		t.Run(tc.preset, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "node")
			if _, _, err := rdmactl(t, "simulate", "--preset", tc.preset, "--root", root); err != nil {
				t.Fatal(err)
			}
			table, warnings, err := rdmactl(t, "discover", "--sysfs-root", root+"/sys", "--dev-root", root+"/dev")
			if err != nil || warnings != "" {
				t.Fatalf("discover: %v, stderr %q", err, warnings)
			}
			lines := strings.Split(strings.TrimSpace(table), "\n")
			if len(lines) != 3 || strings.Join(strings.Fields(lines[1]), " ") != tc.row {
				t.Errorf("table:\n%s\nwant row %q", table, tc.row)
			}

			// Asked to use this host's netlink: its answer, or its refusal as a warning.
			table, warnings, err = rdmactl(t, "discover", "--sysfs-root", root+"/sys", "--dev-root", root+"/dev", "--netlink=on")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(warnings, "protocol not supported") {
				for _, w := range []string{
					"warning: rdma netlink: socket: protocol not supported; netns mode from sysfs",
					"warning: rdma netlink: socket: protocol not supported; netdevs from sysfs only",
				} {
					if !strings.Contains(warnings, w) {
						t.Errorf("stderr lacks %q:\n%s", w, warnings)
					}
				}
			} else if !strings.Contains(table, "RDMA netns mode:") || !strings.Contains(table, "(RDMA netlink)") {
				t.Errorf("this host's RDMA netlink answered, but the table does not say so:\n%s\n%s", table, warnings)
			}
		})
	}
}

// TestDiscoverWide: -o wide shows every field the driver knows of each
// HCA, those kept out of the slice too, each with where it lives, and
// agrees with -o yaml on what the slice has.
func TestDiscoverWide(t *testing.T) {
	root := filepath.Join(t.TempDir(), "node")
	if _, _, err := rdmactl(t, "simulate", "--preset", "rxe", "--root", root); err != nil {
		t.Fatal(err)
	}
	out, warnings, err := rdmactl(t, "discover", "--sysfs-root", root+"/sys", "--dev-root", root+"/dev", "-o", "wide")
	if err != nil || warnings != "" {
		t.Fatalf("discover -o wide: %v, stderr %q", err, warnings)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && strings.Contains(f[0], "/") {
			rows[f[0]] = f[1] + " " + f[2]
		}
	}
	for field, want := range map[string]string{
		"rdma.dra.dev/ibdev":        "rxe0 metadata",
		"rdma.dra.dev/nodeGUID":     "metadata",
		"rdma.dra.dev/roceGIDIndex": "metadata",
		"rdma.dra.dev/portState":    "ACTIVE metadata",
		"rdma.dra.dev/linkLayer":    "Ethernet slice",
		"rdma.dra.dev/software":     "true slice",
		"rdma.dra.dev/legacy":       "false slice",
		"rdma.dra.dev/uverbs":       "/dev/infiniband/uverbs0 metadata",
	} {
		got, ok := rows[field]
		if !ok || !strings.HasSuffix(got, want) {
			t.Errorf("field %s: %q (present %v), want it to end in %q\n%s", field, got, ok, want, out)
		}
	}
	yamlOut, _, err := rdmactl(t, "discover", "--sysfs-root", root+"/sys", "--dev-root", root+"/dev", "-o", "yaml", "--node-name", "n")
	if err != nil {
		t.Fatal(err)
	}
	for field, v := range rows {
		name := strings.TrimPrefix(field, "rdma.dra.dev/")
		inYAML := strings.Contains(yamlOut, "rdma.dra.dev/"+name+":")
		if inYAML != strings.HasSuffix(v, " slice") {
			t.Errorf("field %s is %q in -o wide, but in -o yaml's slice: %v", field, v, inYAML)
		}
	}
}

func TestDiscoverWideDataPath(t *testing.T) {
	for _, tc := range []struct {
		preset       string
		want, absent []string
	}{{
		preset: "gb300",
		want: []string{
			"mlx5-0 mlx5_0 ConnectX-8 InfiniBand 800 Gb/s ACTIVE 0 pci0008:00 ibp1s0 uverbs0",
			"data path: 0008:03:00.0 (the Data Direct DMA function of 0000:01:00.0's card), root pci0008:00",
			"GPUs: 0008:06:00.0 (under the switch at 0008:01:00.0)",
			"board: MT2516X00000 (NVIDIA ConnectX-8 SuperNIC, 800Gb/s XDR IB)",
			"switch port 0008:02:00.0 toward 0008:03:00.0: ACS SV CR UF",
			"GPUDirect: ready",
			"rdma.dra.dev/pfPCIeRoot pci0000:00 metadata",
			"resource.kubernetes.io/pcieRoot pci0008:00 slice",
		},
		absent: []string{"taint:", "not-ready"},
	}, {
		preset: "gb300-acs-bad",
		want: []string{
			"switch port 0008:02:00.0 toward 0008:03:00.0: ACS SV RR CR UF",
			"GPUDirect: not-ready (acs-redirects-p2p): ACS P2P Request Redirect is set on switch port 0008:02:00.0",
			"taint: rdma.dra.dev/gpudirect-not-ready=acs-redirects-p2p:NoSchedule (the HCA works;",
			"rdma.dra.dev/gpuDirect not-ready metadata",
		},
	}, {
		preset: "gb200",
		want: []string{
			"data path: 0000:01:00.0 (its own function), root pci0000:00",
			"GPUs: 0008:01:00.0, 0009:01:00.0 (the same NUMA node, no PCIe in common)",
		},
		absent: []string{"taint:", "GPUDirect:"},
	}} {
		t.Run(tc.preset, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "node")
			if _, _, err := rdmactl(t, "simulate", "--preset", tc.preset, "--root", root); err != nil {
				t.Fatal(err)
			}
			out, warnings, err := rdmactl(t, "discover", "-o", "wide", "--netlink=off", "--sysfs-root", root+"/sys", "--dev-root", root+"/dev")
			if err != nil || warnings != "" {
				t.Fatalf("discover: %v, stderr %q", err, warnings)
			}
			var lines []string
			for _, l := range strings.Split(out, "\n") {
				lines = append(lines, strings.Join(strings.Fields(l), " "))
			}
			flat := strings.Join(lines, "\n")
			for _, w := range tc.want {
				if !strings.Contains(flat, w) {
					t.Errorf("no %q in:\n%s", w, out)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(flat, a) {
					t.Errorf("%q in:\n%s", a, out)
				}
			}
		})
	}
}
