package devices

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// attr is one attribute in the driver's domain. The constants are in
// priority order: should a device ever have more attributes and capacities
// than a ResourceSlice allows, the last ones are left out.
type attr int

const (
	attrIBDev attr = iota
	attrTransport
	attrLinkLayer
	attrModel
	attrVendorID
	attrDeviceID
	attrHCAType
	attrFirmwareVersion
	attrNodeGUID
	attrSysImageGUID
	attrPortState
	attrPhysState
	attrRateGbps
	attrPorts
	attrNetdev
	attrSRIOVVF
	attrPFPCIBusID
	attrLID
	attrRoCEGIDIndex
	attrSoftware
	attrNetnsMode
	attrDataPathPCIBusID
	attrDataDirect
	attrPFPCIeRoot
	attrGPUs
	attrGPULink
	attrBoardSerial
	attrGPUDirect
	attrGPUDirectCause
	numAttrs
)

// attrIDs are the attribute names, "<driver>/<id>" in a slice. They are the
// contract documented in docs/attributes.md: never rename one.
var attrIDs = [numAttrs]string{
	attrIBDev:           "ibdev",
	attrTransport:       "transport",
	attrLinkLayer:       "linkLayer",
	attrModel:           "model",
	attrVendorID:        "vendorID",
	attrDeviceID:        "deviceID",
	attrHCAType:         "hcaType",
	attrFirmwareVersion: "firmwareVersion",
	attrNodeGUID:        "nodeGUID",
	attrSysImageGUID:    "sysImageGUID",
	attrPortState:       "portState",
	attrPhysState:       "physState",
	attrRateGbps:        "rateGbps",
	attrPorts:           "ports",
	attrNetdev:          "netdev",
	attrSRIOVVF:         "sriovVF",
	attrPFPCIBusID:      "pfPCIBusID",
	attrLID:             "lid",
	attrRoCEGIDIndex:    "roceGIDIndex",
	attrSoftware:        "software",
	attrNetnsMode:       "netnsMode",
	// The GPU data path (hca.DataPath), for the workload and diagnostics:
	// pairing with GPUs goes through the standard pcieRoot and numaNode.
	attrDataPathPCIBusID: "dataPathPCIBusID",
	attrDataDirect:       "dataDirect",
	attrPFPCIeRoot:       "pfPCIeRoot",
	attrGPUs:             "gpus",
	attrGPULink:          "gpuLink",
	attrBoardSerial:      "boardSerial",
	attrGPUDirect:        "gpuDirect",
	attrGPUDirectCause:   "gpuDirectCause",
}

// inSlice marks the driver attributes a ResourceSlice carries: each one is
// used by a documented selector (a DeviceClass in deployments/, an example in
// docs/) or a stated user story (firmware minimums, rate, link layer, model,
// VF or PF, software devices, netdev for RoCE rails). The others are identity
// and diagnostics that nobody selects on, some changing at run time: they are
// in the device metadata file and `rdmactl discover -o wide` only. The
// scheduler converts every attribute of a candidate device at each selector
// evaluation, so each one in the slice costs every pod on every node
// (docs/performance.md).
var inSlice = [numAttrs]bool{
	attrTransport:       true,
	attrLinkLayer:       true,
	attrModel:           true,
	attrFirmwareVersion: true,
	attrRateGbps:        true,
	attrNetdev:          true,
	attrSRIOVVF:         true,
	attrSoftware:        true,
}

// InSlice reports whether an attribute ("<driver>/<id>" or a standard
// "resource.kubernetes.io/..." name) is published in ResourceSlices; every
// other attribute Metadata returns is in the metadata file only.
func InSlice(name string, opts Options) bool {
	return newMapper(opts.driverName(), "").slice[resourceapi.QualifiedName(name)]
}

// AttributeString formats an attribute's value for people: a string or
// version as itself, an int or bool in Go's usual form, and "-" when no
// value is set.
func AttributeString(a resourceapi.DeviceAttribute) string {
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return strconv.FormatInt(*a.IntValue, 10)
	case a.BoolValue != nil:
		return strconv.FormatBool(*a.BoolValue)
	case a.VersionValue != nil:
		return *a.VersionValue
	}
	return "-"
}

// mapper turns HCAs into attribute maps for one driver name.
type mapper struct {
	names  [numAttrs]resourceapi.QualifiedName
	legacy resourceapi.QualifiedName
	netns  hca.NetnsMode
	// slice is the set of attribute names a ResourceSlice carries.
	slice map[resourceapi.QualifiedName]bool
}

func newMapper(driver string, netns hca.NetnsMode) *mapper {
	m := &mapper{netns: netns, legacy: resourceapi.QualifiedName(driver + "/" + AttrLegacy)}
	m.slice = map[resourceapi.QualifiedName]bool{
		m.legacy: true,
		// PCIe and NUMA alignment (matchAttribute with GPUs and between
		// HCAs); pciBusID names one device, which no selector does.
		deviceattribute.StandardDeviceAttributePCIeRoot: true,
		deviceattribute.StandardDeviceAttributeNUMANode: true,
	}
	for i, id := range attrIDs {
		m.names[i] = resourceapi.QualifiedName(driver + "/" + id)
		if inSlice[i] {
			m.slice[m.names[i]] = true
		}
	}
	return m
}

// attrSet fills an attribute map: with keep set, only the names it holds,
// up to the per-device limit, first come first served.
type attrSet struct {
	m    map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	keep map[resourceapi.QualifiedName]bool // nil: every attribute, no limit
}

// maxCapacities is the most capacities a device has: shares, hcaHandles,
// hcaObjects.
const maxCapacities = 3

// maxAttributes is the per-device budget of attributes: what the API allows
// for attributes and capacities together, less the capacities and the
// legacy marker Devices adds.
const maxAttributes = resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice - maxCapacities - 1

func (s attrSet) put(name resourceapi.QualifiedName, v resourceapi.DeviceAttribute) {
	if s.keep == nil || s.keep[name] && len(s.m) < maxAttributes {
		s.m[name] = v
	}
}

// putString adds a string attribute unless the value is empty. Values are
// cut to resourceapi.DeviceAttributeMaxValueLength bytes on a character
// boundary; nothing discovery reports comes near it.
func (s attrSet) putString(name resourceapi.QualifiedName, v string) {
	if v == "" {
		return
	}
	v = truncate(v, resourceapi.DeviceAttributeMaxValueLength)
	s.put(name, resourceapi.DeviceAttribute{StringValue: &v})
}

func (s attrSet) putInt(name resourceapi.QualifiedName, v int64) {
	s.put(name, resourceapi.DeviceAttribute{IntValue: &v})
}

func (s attrSet) putBool(name resourceapi.QualifiedName, v bool) {
	s.put(name, resourceapi.DeviceAttribute{BoolValue: &v})
}

func (s attrSet) putStandard(a deviceattribute.DeviceAttribute, err error) {
	if err == nil {
		s.put(a.Name, a.Value)
	}
}

// attributes is the contract: docs/attributes.md describes every entry.
// With all false they are the slice's (inSlice), else every attribute the
// driver knows, for the metadata file.
func (m *mapper) attributes(h *hca.HCA, all bool) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	s := attrSet{m: make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, 24)}
	if !all {
		s.keep = m.slice
	}
	n := &m.names
	var port *hca.Port
	if len(h.Ports) > 0 {
		port = &h.Ports[0]
	}
	transport := h.Transport()

	s.putString(n[attrIBDev], h.Name)
	s.putString(n[attrTransport], string(transport))
	if port != nil {
		s.putString(n[attrLinkLayer], string(port.LinkLayer))
	}
	s.putString(n[attrModel], h.Model)
	if pci := h.PCI; pci != nil {
		s.putString(n[attrVendorID], pci.VendorID)
		s.putString(n[attrDeviceID], pci.DeviceID)
	}
	s.putString(n[attrHCAType], h.HCAType)
	if v, ok := firmwareVersion(h.FirmwareVer); ok {
		s.put(n[attrFirmwareVersion], resourceapi.DeviceAttribute{VersionValue: &v})
	}
	// Standard attributes: topology for matchAttribute constraints.
	if pci := h.PCI; pci != nil {
		s.putStandard(deviceattribute.GetPCIBusIDAttribute(pci.BusID))
		if root := dataPathRoot(h); root != "" {
			s.putString(deviceattribute.StandardDeviceAttributePCIeRoot, root)
		}
		if pci.NUMANode >= 0 {
			s.putStandard(deviceattribute.GetNUMANodeAttribute(pci.NUMANode, deviceattribute.ScalarAttribute))
		}
	}
	s.putString(n[attrNodeGUID], h.NodeGUID)
	s.putString(n[attrSysImageGUID], h.SysImageGUID)
	if port != nil {
		s.putString(n[attrPortState], port.State)
		s.putString(n[attrPhysState], port.PhysState)
		if r := port.RateGbps; r >= 0 && r < math.MaxInt32 { // false for NaN
			s.putInt(n[attrRateGbps], int64(math.Floor(r)))
		}
	}
	s.putInt(n[attrPorts], int64(len(h.Ports)))
	if len(h.Netdevs) > 0 {
		s.putString(n[attrNetdev], h.Netdevs[0])
	}
	vf := h.PCI != nil && h.PCI.SRIOV == hca.SRIOVVF
	s.putBool(n[attrSRIOVVF], vf)
	if vf {
		s.putString(n[attrPFPCIBusID], h.PCI.PFBusID)
	}
	if port != nil && port.LinkLayer == hca.LinkLayerInfiniBand {
		s.putInt(n[attrLID], int64(port.LID))
	}
	if port != nil && transport == hca.TransportRoCE && port.RoCEv2GIDIndex >= 0 {
		s.putInt(n[attrRoCEGIDIndex], int64(port.RoCEv2GIDIndex))
	}
	s.putBool(n[attrSoftware], h.Software)
	s.putString(n[attrNetnsMode], string(m.netns))
	if dp := h.DataPath; dp != nil {
		s.putString(n[attrDataPathPCIBusID], dp.Function)
		s.putBool(n[attrDataDirect], dp.DataDirect)
		if dp.DataDirect && h.PCI != nil {
			s.putString(n[attrPFPCIeRoot], h.PCI.PCIeRoot)
		}
		s.putString(n[attrGPUs], joinFit(dp.GPUs, ",", resourceapi.DeviceAttributeMaxValueLength))
		s.putString(n[attrGPULink], string(dp.GPULink))
		s.putString(n[attrBoardSerial], dp.Board)
		s.putString(n[attrGPUDirect], string(dp.GPUDirect))
		s.putString(n[attrGPUDirectCause], dp.GPUDirectCause)
	}
	return s.m
}

// dataPathRoot is the root complex GPU peer-to-peer DMA enters the HCA by: its
// data path function's (the Data Direct DMA function's on a ConnectX-8
// Data Direct card), else its own function's. docs/gpu-alignment.md says
// why the standard attribute carries this one.
func dataPathRoot(h *hca.HCA) string {
	if h.DataPath != nil && h.DataPath.PCIeRoot != "" {
		return h.DataPath.PCIeRoot
	}
	if h.PCI != nil {
		return h.PCI.PCIeRoot
	}
	return ""
}

// joinFit joins as many whole items as fit in max bytes.
func joinFit(items []string, sep string, max int) string {
	out := ""
	for _, it := range items {
		next := it
		if out != "" {
			next = out + sep + it
		}
		if len(next) > max {
			break
		}
		out = next
	}
	return out
}

// firmwareVersion turns a kernel fw_ver into a semantic version as the
// apiserver and the scheduler's CEL environment (blang/semver Parse) accept
// it, or reports false when fw_ver is not dot-separated decimal numbers:
//
//   - leading zeros are dropped from every component: 16.035.4030 is 16.35.4030;
//   - fewer than three components are padded: 1.70 is 1.70.0;
//   - components past the third become build metadata, which semver
//     comparisons ignore: 218.0.169.0 (bnxt_re) is 218.0.169+0.
//
// Major, minor and patch must fit in 64 bits. When the build metadata would
// make the value longer than resourceapi.DeviceAttributeMaxValueLength it is
// dropped.
func firmwareVersion(fw string) (string, bool) {
	parts := strings.Split(strings.TrimSpace(fw), ".")
	for i, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return "", false
		}
		if p = strings.TrimLeft(p, "0"); p == "" {
			p = "0"
		}
		if i < 3 {
			if _, err := strconv.ParseUint(p, 10, 64); err != nil {
				return "", false
			}
		}
		parts[i] = p
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	v := strings.Join(parts[:3], ".")
	if len(parts) > 3 {
		if full := v + "+" + strings.Join(parts[3:], "."); len(full) <= resourceapi.DeviceAttributeMaxValueLength {
			v = full
		}
	}
	return v, true
}

// truncate cuts s to at most n bytes without splitting a character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
