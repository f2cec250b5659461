package hcatest

// The Grace trays: GB200 (ConnectX-7 on Grace root ports) and GB300
// (ConnectX-8 with Data Direct), with their GPUs, switches, ACS and VPDs.

import "fmt"

// ACS control bits of a PCIe port, and the setting the kernel enables on
// every ACS-capable downstream and root port by default.
const (
	acsSV            uint16 = 0x01 // Source Validation
	acsRR            uint16 = 0x04 // P2P Request Redirect
	acsCR            uint16 = 0x08 // P2P Completion Redirect
	acsUF            uint16 = 0x10 // Upstream Forwarding
	acsKernelDefault        = acsSV | acsRR | acsCR | acsUF
)

// nvidiaGPU is an NVIDIA GPU (a 3D controller, bound to nvidia) at path.
func nvidiaGPU(device string, path []string, numa int, iommu string) PCIDevSpec {
	return PCIDevSpec{Path: path, Vendor: "10de", Device: device, SubsystemVendor: "10de", SubsystemDevice: "16c1",
		Class: "030200", Driver: "nvidia", NUMANode: numa, IOMMUGroup: iommu}
}

// graceRootPort is a Grace root port (10de:22b1, one of rdma_topo's
// grace_rp IDs) alone on the root bus of its own PCI domain, as Grace lays
// its root complexes out: pci<domain>:00/<domain>:00:00.0.
func graceRootPort(domain, numa int, acs uint16, iommu string) PCIDevSpec {
	return PCIDevSpec{Path: []string{fmt.Sprintf("pci%04x:00", domain), fmt.Sprintf("%04x:00:00.0", domain)},
		Vendor: "10de", Device: "22b1", Class: "060400", Driver: "pcieport", NUMANode: numa, ACS: &acs, IOMMUGroup: iommu}
}

// under is the path of function bus behind the device d.
func under(d PCIDevSpec, bus string) []string { return append(append([]string(nil), d.Path...), bus) }

// iommuGroups hands out IOMMU group numbers in order.
type iommuGroups int

func (g *iommuGroups) next() string { *g++; return fmt.Sprint(int(*g) - 1) }

// gb200 is a Grace-Blackwell GB200 compute tray "gb200-01": two Grace
// sockets (NUMA 0 and 1), each with two B200 GPUs and two ConnectX-7 NDR
// InfiniBand HCAs, every one of them alone behind its own Grace root port
// in its own PCI domain (rdma_topo's NUMA-based topology: no PCIe in
// common, pairs by NUMA node):
//
//	mlx5_0 0000:01:00.0 ibp1s0     NUMA 0   GPU 0008:01:00.0 NUMA 0
//	mlx5_1 0002:01:00.0 ibP2p1s0   NUMA 0   GPU 0009:01:00.0 NUMA 0
//	mlx5_2 0010:01:00.0 ibP16p1s0  NUMA 1   GPU 0018:01:00.0 NUMA 1
//	mlx5_3 0012:01:00.0 ibP18p1s0  NUMA 1   GPU 0019:01:00.0 NUMA 1
//
// Root ports have the kernel's default ACS, so every function has its own
// IOMMU group. Each HCA's VPD names its own card (serial MT2430X0000I,
// V3 its own). uverbsI/umadI, rdma_cm 10:58, netns shared.
func gb200() Spec {
	s := Spec{Hostname: "gb200-01", NetnsShared: true, RDMACMMinor: 58}
	var groups iommuGroups
	for i, d := range []struct{ nic, gpu, numa int }{{0x0000, 0x0008, 0}, {0x0002, 0x0009, 0}, {0x0010, 0x0018, 1}, {0x0012, 0x0019, 1}} {
		rp := graceRootPort(d.nic, d.numa, acsKernelDefault, groups.next())
		guid := fmt.Sprintf("a088:c203:00c2:%04x", 0x0200+0x10*i)
		h := cx7(fmt.Sprintf("mlx5_%d", i), guid, under(rp, fmt.Sprintf("%04x:01:00.0", d.nic)), d.numa, i, uint16(0x40+i))
		h.PCI.VPD = &VPDSpec{Name: "NVIDIA ConnectX-7 HHHL adapter card, 400Gb/s NDR IB", PartNumber: "MCX75310AAS-NEAT",
			EC: "A7", Serial: fmt.Sprintf("MT2430X0%04d", i), V3: fmt.Sprintf("6c1f0a2e4b7d11ee8000a088c200%04x", i)}
		h.PCI.IOMMUGroup = groups.next()
		s.HCAs = append(s.HCAs, h)
		gpuRP := graceRootPort(d.gpu, d.numa, acsKernelDefault, groups.next())
		s.Devices = append(s.Devices, rp, gpuRP, nvidiaGPU("2901", under(gpuRP, fmt.Sprintf("%04x:01:00.0", d.gpu)), d.numa, groups.next()))
	}
	return s
}

// gb300 is a Grace-Blackwell GB300 compute tray "gb300-01" with ConnectX-8
// Data Direct, laid out as rdma_topo's DMA-based complex. Per GPU (two per
// Grace socket) a Grace root port leads to the ConnectX-8's PCIe switch
// (15b3:197c): one downstream port to the card's DMA function (15b3:2100),
// the other through a nested ConnectX switch to the B300 GPU. The card's
// PF (15b3:1023, the ibdev) sits behind a root port of its own; PF and DMA
// function carry the same VPD V3. Complex c (0-3), NUMA c/2:
//
//	PF mlx5_c   <pf>:01:00.0   pf = 0000, 0002, 0010, 0012    ibp1s0, ibP2p1s0, ibP16p1s0, ibP18p1s0
//	root port   <d>:00:00.0    d  = 0008, 0009, 0018, 0019
//	switch USP  <d>:01:00.0
//	DSP         <d>:02:00.0 -> DMA function <d>:03:00.0
//	DSP         <d>:02:01.0 -> USP <d>:04:00.0 -> DSP <d>:05:00.0 -> GPU <d>:06:00.0
//
// The two ConnectX-8 of a socket share one board (VPD serial MT2516X0000S).
// With goodACS the ACS is what rdma_topo's write-grub-acs sets: the DSP
// toward the DMA function UF CR SV (P2P requests pass), the DSP toward the
// GPU UF RR SV, the root port without SV so the segment is one IOMMU group;
// other ports the kernel default. Without it ("gb300-acs-bad", a kernel
// booted without config_acs) every port has the kernel default SV RR CR UF
// and every function its own IOMMU group. ConnectX-8 XDR InfiniBand at
// 800G; uverbsC/umadC, rdma_cm 10:58, netns shared.
func gb300(goodACS bool) Spec {
	s := Spec{Hostname: "gb300-01", NetnsShared: true, RDMACMMinor: 58}
	var groups iommuGroups
	for c, d := range []struct{ pf, seg int }{{0x0000, 0x0008}, {0x0002, 0x0009}, {0x0010, 0x0018}, {0x0012, 0x0019}} {
		numa := c / 2
		v3 := fmt.Sprintf("9e3b5c714a2f11f0b000c470bd8a%04x", c)
		board := &VPDSpec{Name: "NVIDIA ConnectX-8 SuperNIC, 800Gb/s XDR IB", PartNumber: "900-9X81Q-00CN-ST0",
			EC: "A1", Serial: fmt.Sprintf("MT2516X0%04d", numa), V3: v3}

		pfRP := graceRootPort(d.pf, numa, acsKernelDefault, groups.next())
		guid := fmt.Sprintf("c470:bd03:008a:%04x", 0x0300+0x10*c)
		h := cx7(fmt.Sprintf("mlx5_%d", c), guid, under(pfRP, fmt.Sprintf("%04x:01:00.0", d.pf)), numa, c, uint16(0x60+c))
		h.FWVer, h.HCAType, h.BoardID = "40.44.1036", "MT4131", "MT_0000001179"
		h.Ports[0].Rate = "800 Gb/sec (4X XDR)"
		h.PCI.Device, h.PCI.SubsystemDevice = "1023", "0026"
		h.PCI.VPD, h.PCI.IOMMUGroup = board, groups.next()
		s.HCAs = append(s.HCAs, h)

		rootACS, dmaACS, gpuACS := acsRR|acsCR|acsUF, acsUF|acsCR|acsSV, acsUF|acsRR|acsSV
		if !goodACS {
			rootACS, dmaACS, gpuACS = acsKernelDefault, acsKernelDefault, acsKernelDefault
		}
		segment := groups.next() // the whole segment when the root port skips SV
		group := func() string {
			if goodACS {
				return segment
			}
			return groups.next()
		}
		bus := func(b, dev int) string { return fmt.Sprintf("%04x:%02x:%02x.0", d.seg, b, dev) }
		cxSwitch := func(path []string, acs *uint16) PCIDevSpec {
			return PCIDevSpec{Path: path, Vendor: "15b3", Device: "197c", Class: "060400", Driver: "pcieport",
				NUMANode: numa, ACS: acs, IOMMUGroup: group()}
		}
		rp := graceRootPort(d.seg, numa, rootACS, group())
		usp := cxSwitch(under(rp, bus(1, 0)), nil)
		dmaDSP := cxSwitch(under(usp, bus(2, 0)), &dmaACS)
		dma := PCIDevSpec{Path: under(dmaDSP, bus(3, 0)), Vendor: "15b3", Device: "2100", SubsystemVendor: "15b3", SubsystemDevice: "0026",
			Class: "088000", Driver: "mlx5_data_direct", NUMANode: numa, VPD: board, IOMMUGroup: group()}
		gpuDSP := cxSwitch(under(usp, bus(2, 1)), &gpuACS)
		usp2 := cxSwitch(under(gpuDSP, bus(4, 0)), nil)
		nested := acsKernelDefault
		dsp2 := cxSwitch(under(usp2, bus(5, 0)), &nested)
		gpu := nvidiaGPU("3182", under(dsp2, bus(6, 0)), numa, group())
		s.Devices = append(s.Devices, pfRP, rp, usp, dmaDSP, dma, gpuDSP, usp2, dsp2, gpu)
	}
	return s
}
