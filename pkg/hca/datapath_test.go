package hca_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

func pciFile(sys, bdf, name string) string {
	return filepath.Join(sys, "bus", "pci", "devices", bdf, name)
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dataPathCase is a preset, possibly changed, and the data path discovery
// must find for one of its HCAs.
type dataPathCase struct {
	name, preset, hca string
	mutate            func(t *testing.T, sys string)
	want              *hca.DataPath
	// reasonHas, when set, replaces the comparison of GPUDirectReason
	// (a sentence) with words it must hold.
	reasonHas []string
	warnHas   []string // in the HCA's or the node's warnings
}

func dataPathCases() []dataPathCase {
	gb300Ready := &hca.DataPath{Function: "0008:03:00.0", DataDirect: true, PCIeRoot: "pci0008:00",
		GPUs: []string{"0008:06:00.0"}, GPULink: hca.GPULinkSwitch, Shared: "0008:01:00.0",
		Board: "MT2516X00000", Product: "NVIDIA ConnectX-8 SuperNIC, 800Gb/s XDR IB",
		ACS: []hca.ACSPort{
			{BusID: "0008:02:00.0", Toward: "0008:03:00.0", HasACS: true, Control: 0x19},
			{BusID: "0008:02:01.0", Toward: "0008:06:00.0", HasACS: true, Control: 0x15},
		},
		GPUDirect: hca.GPUDirectReady}
	// pfOnly is today's answer for gb300's mlx5_0: its own function, and
	// the GPUs of its NUMA node since it shares no PCIe with one.
	pfOnly := &hca.DataPath{Function: "0000:01:00.0", PCIeRoot: "pci0000:00",
		GPUs: []string{"0008:06:00.0", "0009:06:00.0"}, GPULink: hca.GPULinkNUMA,
		Board: "MT2516X00000", Product: "NVIDIA ConnectX-8 SuperNIC, 800Gb/s XDR IB"}
	return []dataPathCase{{
		name: "gb300: the Data Direct function beside its GPU", preset: "gb300", hca: "mlx5_0", want: gb300Ready,
	}, {
		name: "gb300-acs-bad: requests redirected, IOMMU groups split", preset: "gb300-acs-bad", hca: "mlx5_0",
		want: func() *hca.DataPath {
			dp := *gb300Ready
			dp.ACS = []hca.ACSPort{
				{BusID: "0008:02:00.0", Toward: "0008:03:00.0", HasACS: true, Control: 0x1d},
				{BusID: "0008:02:01.0", Toward: "0008:06:00.0", HasACS: true, Control: 0x1d},
			}
			dp.GPUDirect, dp.GPUDirectCause = hca.GPUDirectNotReady, hca.GPUDirectCauseACS
			return &dp
		}(),
		reasonHas: []string{"P2P Request Redirect is set on switch port 0008:02:00.0 toward 0008:03:00.0", "different IOMMU groups"},
	}, {
		name: "gb200: Grace root ports, GPUs of the NUMA node", preset: "gb200", hca: "mlx5_2",
		want: &hca.DataPath{Function: "0010:01:00.0", PCIeRoot: "pci0010:00", GPUs: []string{"0018:01:00.0", "0019:01:00.0"},
			GPULink: hca.GPULinkNUMA, Board: "MT2430X00002", Product: "NVIDIA ConnectX-7 HHHL adapter card, 400Gb/s NDR IB"},
	}, {
		name: "dgx-h100: GPUs on the root complex", preset: "dgx-h100", hca: "mlx5_1",
		want: &hca.DataPath{Function: "0000:17:00.0", PCIeRoot: "pci0000:15", GPUs: []string{"0000:18:00.0", "0000:19:00.0"},
			GPULink: hca.GPULinkRootComplex},
	}, {
		name: "dgx-h100: BlueField-3 with no GPU near", preset: "dgx-h100", hca: "mlx5_8",
		want: &hca.DataPath{Function: "0000:d1:00.0", PCIeRoot: "pci0000:d0", GPUs: []string{"0000:9d:00.0", "0000:9e:00.0", "0000:c3:00.0", "0000:c4:00.0"}, GPULink: hca.GPULinkNUMA},
	}, {
		name: "VF: its own function", preset: "roce-sriov", hca: "mlx5_3",
		want: &hca.DataPath{Function: "0000:3b:00.3", PCIeRoot: "pci0000:3a"},
	}, {
		name: "garbled PF VPD: today's answer and the file named", preset: "gb300", hca: "mlx5_0",
		mutate: func(t *testing.T, sys string) {
			path := pciFile(sys, "0000:01:00.0", "vpd")
			writeFile(t, path, readFile(t, path)[:20])
		},
		want:    func() *hca.DataPath { dp := *pfOnly; dp.Board, dp.Product = "", ""; return &dp }(),
		warnHas: []string{"0000:01:00.0/vpd: byte 0: resource 0x82 of 42 bytes runs past the end (20)", "taken to be the PF"},
	}, {
		name: "VPD checksum wrong", preset: "gb300", hca: "mlx5_0",
		mutate: func(t *testing.T, sys string) {
			path := pciFile(sys, "0000:01:00.0", "vpd")
			b := readFile(t, path)
			b[len(b)-2]++ // the RV checksum byte
			writeFile(t, path, b)
		},
		want:    func() *hca.DataPath { dp := *pfOnly; dp.Board, dp.Product = "", ""; return &dp }(),
		warnHas: []string{"0000:01:00.0/vpd: VPD-R at byte", "checksum (RV) does not match"},
	}, {
		name: "two Data Direct functions claim one card", preset: "gb300", hca: "mlx5_0",
		mutate: func(t *testing.T, sys string) {
			writeFile(t, pciFile(sys, "0009:03:00.0", "vpd"), readFile(t, pciFile(sys, "0008:03:00.0", "vpd")))
		},
		want:    pfOnly,
		warnHas: []string{"is carried by the Data Direct functions 0008:03:00.0, 0009:03:00.0 alike"},
	}, {
		// A card with two PFs (one per port): both carry its V3, both
		// enter GPU DMA by its one DMA function.
		name: "second PF of a card", preset: "gb300", hca: "mlx5_1",
		mutate: func(t *testing.T, sys string) {
			writeFile(t, pciFile(sys, "0002:01:00.0", "vpd"), readFile(t, pciFile(sys, "0000:01:00.0", "vpd")))
		},
		want: gb300Ready,
	}, {
		name: "PF VPD without V3", preset: "gb300", hca: "mlx5_0",
		mutate:  func(t *testing.T, sys string) { os.Remove(pciFile(sys, "0000:01:00.0", "vpd")) },
		want:    func() *hca.DataPath { dp := *pfOnly; dp.Board, dp.Product = "", ""; return &dp }(),
		warnHas: []string{"0000:01:00.0/vpd has no V3 keyword: 0000:01:00.0 cannot be matched to the Data Direct functions 0008:03:00.0, 0009:03:00.0, 0018:03:00.0, 0019:03:00.0"},
	}, {
		name: "switch port config as a non-root reader sees it", preset: "gb300", hca: "mlx5_0",
		mutate: func(t *testing.T, sys string) {
			path := pciFile(sys, "0008:02:00.0", "config")
			writeFile(t, path, readFile(t, path)[:64])
		},
		want: func() *hca.DataPath {
			dp := *gb300Ready
			dp.ACS = []hca.ACSPort{{BusID: "0008:02:00.0", Toward: "0008:03:00.0"}, gb300Ready.ACS[1]}
			dp.GPUDirect, dp.GPUDirectCause = hca.GPUDirectUnknown, hca.GPUDirectCauseUnreadable
			return &dp
		}(),
		reasonHas: []string{"the ACS of switch port 0008:02:00.0 is unknown", "64 bytes, no extended configuration space"},
		warnHas:   []string{"0008:02:00.0/config: 64 bytes"},
	}, {
		name: "switch port config whose capability list loops", preset: "gb300", hca: "mlx5_0",
		mutate: func(t *testing.T, sys string) {
			path := pciFile(sys, "0008:02:00.0", "config")
			b := readFile(t, path)
			b[0x102], b[0x103] = 0x01, 0x10 // AER's next pointer: back to 0x100
			writeFile(t, path, b)
		},
		want: func() *hca.DataPath {
			dp := *gb300Ready
			dp.ACS = []hca.ACSPort{{BusID: "0008:02:00.0", Toward: "0008:03:00.0"}, gb300Ready.ACS[1]}
			dp.GPUDirect, dp.GPUDirectCause = hca.GPUDirectUnknown, hca.GPUDirectCauseUnreadable
			return &dp
		}(),
		reasonHas: []string{"points back to 0x100"},
		warnHas:   []string{"0008:02:00.0/config: extended capability at 0x100 points back to 0x100"},
	}, {
		name: "garbled GPU modalias: the GPU is not counted", preset: "gb300", hca: "mlx5_0",
		mutate: func(t *testing.T, sys string) {
			writeFile(t, pciFile(sys, "0008:06:00.0", "modalias"), []byte("pci:vXYZ\n"))
		},
		want: func() *hca.DataPath {
			dp := *gb300Ready
			dp.GPUs, dp.GPULink, dp.Shared, dp.ACS, dp.GPUDirect = []string{"0009:06:00.0"}, hca.GPULinkNUMA, "", nil, ""
			return &dp
		}(),
		warnHas: []string{`0008:06:00.0/modalias: cannot parse "pci:vXYZ"`},
	}, {
		name: "PF missing from bus/pci/devices", preset: "gb300", hca: "mlx5_0",
		mutate:  func(t *testing.T, sys string) { os.Remove(filepath.Join(sys, "bus", "pci", "devices", "0000:01:00.0")) },
		want:    nil,
		warnHas: []string{"0000:01:00.0 is not listed in bus/pci/devices: its GPU data path is unknown"},
	}}
}

func TestDataPath(t *testing.T) {
	for _, tc := range dataPathCases() {
		t.Run(tc.name, func(t *testing.T) {
			n := preset(t, tc.preset)
			if tc.mutate != nil {
				tc.mutate(t, n.SysfsRoot)
			}
			inv := discover(t, n)
			i := slices.IndexFunc(inv.HCAs, func(h hca.HCA) bool { return h.Name == tc.hca })
			h := inv.HCAs[i]
			got := h.DataPath
			if got != nil && len(tc.reasonHas) > 0 {
				for _, w := range tc.reasonHas {
					if !strings.Contains(got.GPUDirectReason, w) {
						t.Errorf("GPUDirect reason %q lacks %q", got.GPUDirectReason, w)
					}
				}
				c := *got
				c.GPUDirectReason = ""
				got = &c
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("data path of %s (-want +got):\n%s", tc.hca, diff)
			}
			warns := strings.Join(append(slices.Clone(inv.Warnings), h.Warnings...), "\n")
			for _, w := range tc.warnHas {
				if !strings.Contains(warns, w) {
					t.Errorf("no warning with %q; warnings:\n%s", w, warns)
				}
			}
			if len(tc.warnHas) == 0 && warns != "" {
				t.Errorf("unexpected warnings:\n%s", warns)
			}
		})
	}
}
