package hca

// pciModel is a marketing name for a PCI vendor:device pair.
type pciModel struct {
	vendor, device, name string
}

// models names the RDMA NICs seen in clusters. A device missing here falls
// back to the kernel's hca_type, so the table only improves names; it never
// decides whether an HCA is usable.
var models = []pciModel{
	// Mellanox / NVIDIA (mlx4, mlx5).
	{"15b3", "1003", "ConnectX-3"},
	{"15b3", "1004", "ConnectX-3 VF"},
	{"15b3", "1007", "ConnectX-3 Pro"},
	{"15b3", "1013", "ConnectX-4"},
	{"15b3", "1014", "ConnectX-4 VF"},
	{"15b3", "1015", "ConnectX-4 Lx"},
	{"15b3", "1016", "ConnectX-4 Lx VF"},
	{"15b3", "1017", "ConnectX-5"},
	{"15b3", "1018", "ConnectX-5 VF"},
	{"15b3", "1019", "ConnectX-5 Ex"},
	{"15b3", "101a", "ConnectX-5 Ex VF"},
	{"15b3", "101b", "ConnectX-6"},
	{"15b3", "101c", "ConnectX-6 VF"},
	{"15b3", "101d", "ConnectX-6 Dx"},
	{"15b3", "101e", "ConnectX VF"}, // mlx5Gen VF of ConnectX-6 Dx and later
	{"15b3", "101f", "ConnectX-6 Lx"},
	{"15b3", "1021", "ConnectX-7"},
	{"15b3", "1023", "ConnectX-8"},
	{"15b3", "a2d2", "BlueField"},
	{"15b3", "a2d3", "BlueField VF"},
	{"15b3", "a2d6", "BlueField-2"},
	{"15b3", "a2dc", "BlueField-3"},
	// Broadcom NetXtreme-E (bnxt_re).
	{"14e4", "16d7", "BCM57414"},
	{"14e4", "16d8", "BCM57416"},
	{"14e4", "16dc", "NetXtreme-E VF"},
	{"14e4", "1750", "BCM57508"},
	{"14e4", "1751", "BCM57504"},
	{"14e4", "1752", "BCM57502"},
	{"14e4", "1760", "BCM57608"},
	{"14e4", "1806", "NetXtreme-E 57500 VF"},
	{"14e4", "1807", "NetXtreme-E 57500 VF"},
	// Intel (irdma on E810 and X722).
	{"8086", "1591", "E810-C"},
	{"8086", "1592", "E810-C"},
	{"8086", "1593", "E810-C"},
	{"8086", "159b", "E810-XXV"},
	{"8086", "1889", "E800 VF"},
	{"8086", "37d2", "X722"},
	// Cloud RDMA NICs.
	{"1d0f", "efa0", "AWS EFA"},
	{"1d0f", "efa1", "AWS EFA"},
	{"1d0f", "efa2", "AWS EFA"},
	{"1d0f", "efa3", "AWS EFA"},
	{"1ded", "107f", "Alibaba eRDMA"},
	{"1414", "00ba", "Microsoft MANA"},
	{"19e5", "a222", "Huawei HNS RoCE"},
	{"19e5", "a226", "Huawei HNS RoCE"},
	{"19e5", "a228", "Huawei HNS RoCE"},
}

// modelName returns the marketing name for a PCI id pair, or "".
func modelName(vendor, device string) string {
	for _, m := range models {
		if m.vendor == vendor && m.device == device {
			return m.name
		}
	}
	return ""
}
