package devices

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// cx8 is a ConnectX-8 PF on pci0000:00 whose GPU data path is the Data
// Direct function 0008:03:00.0 beside GPU 0008:06:00.0, GPUDirect as given.
func cx8(gd hca.GPUDirect, cause string) hca.HCA {
	h := cx7()
	h.Model, h.PCI.DeviceID, h.PCI.BusID, h.PCI.PCIeRoot = "ConnectX-8", "1023", "0000:01:00.0", "pci0000:00"
	h.DataPath = &hca.DataPath{Function: "0008:03:00.0", DataDirect: true, PCIeRoot: "pci0008:00",
		GPUs: []string{"0008:06:00.0"}, GPULink: hca.GPULinkSwitch, Shared: "0008:01:00.0", Board: "MT2516X00000",
		GPUDirect: gd, GPUDirectCause: cause}
	return h
}

func TestDataPathAttributes(t *testing.T) {
	pfPath := cx7()
	pfPath.DataPath = &hca.DataPath{Function: "0000:16:00.0", PCIeRoot: "pci0000:15",
		GPUs: []string{"0000:18:00.0", "0000:19:00.0"}, GPULink: hca.GPULinkRootComplex}
	for _, tc := range []struct {
		name     string
		h        hca.HCA
		pcieRoot string
		metadata map[string]string // data path fields, "" for absent
	}{{
		name: "no data path (today's answer)", h: cx7(), pcieRoot: "pci0000:15",
		metadata: map[string]string{"dataPathPCIBusID": "", "pfPCIeRoot": "", "gpus": "", "gpuDirect": ""},
	}, {
		name: "own function, GPUs on the root complex", h: pfPath, pcieRoot: "pci0000:15",
		metadata: map[string]string{"dataPathPCIBusID": "0000:16:00.0", "dataDirect": "false", "pfPCIeRoot": "",
			"gpus": "0000:18:00.0,0000:19:00.0", "gpuLink": "root-complex", "gpuDirect": "", "gpuDirectCause": ""},
	}, {
		name: "Data Direct, ready", h: cx8(hca.GPUDirectReady, ""), pcieRoot: "pci0008:00",
		metadata: map[string]string{"dataPathPCIBusID": "0008:03:00.0", "dataDirect": "true", "pfPCIeRoot": "pci0000:00",
			"gpus": "0008:06:00.0", "gpuLink": "switch", "boardSerial": "MT2516X00000", "gpuDirect": "ready", "gpuDirectCause": ""},
	}, {
		name: "Data Direct, ACS redirects", h: cx8(hca.GPUDirectNotReady, hca.GPUDirectCauseACS), pcieRoot: "pci0008:00",
		metadata: map[string]string{"dataPathPCIBusID": "0008:03:00.0", "gpuDirect": "not-ready", "gpuDirectCause": "acs-redirects-p2p"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			inv := hca.Inventory{HCAs: []hca.HCA{tc.h}}
			dev := Devices(inv, Options{})[0]
			if got := AttributeString(dev.Attributes["resource.kubernetes.io/pcieRoot"]); got != tc.pcieRoot {
				t.Errorf("pcieRoot = %s, want %s", got, tc.pcieRoot)
			}
			for id := range tc.metadata {
				if _, ok := dev.Attributes[d(id)]; ok {
					t.Errorf("%s is in the slice; it belongs in the metadata file only", id)
				}
			}
			md := Metadata(tc.h, "", "", Options{})
			if got := AttributeString(md["resource.kubernetes.io/pcieRoot"]); got != tc.pcieRoot {
				t.Errorf("metadata pcieRoot = %s, want %s", got, tc.pcieRoot)
			}
			for id, want := range tc.metadata {
				got, ok := md[string(d(id))]
				switch {
				case want == "" && ok:
					t.Errorf("metadata %s = %s, want none", id, AttributeString(got))
				case want != "" && AttributeString(got) != want:
					t.Errorf("metadata %s = %s, want %s", id, AttributeString(got), want)
				}
			}
		})
	}
}

func TestGPUDirectTaint(t *testing.T) {
	since := metav1.NewTime(time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC))
	gpuDirect := resourceapi.DeviceTaint{Key: "rdma.dra.dev/gpudirect-not-ready", Value: "acs-redirects-p2p", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	portDown := resourceapi.DeviceTaint{Key: "rdma.dra.dev/port-down", Value: "DOWN", Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &since}
	down := cx8(hca.GPUDirectNotReady, hca.GPUDirectCauseACS)
	down.Ports[0].State = "DOWN"
	for _, tc := range []struct {
		name  string
		h     hca.HCA
		since map[string]metav1.Time
		want  []resourceapi.DeviceTaint
	}{
		{"not ready: tainted, with no health taints asked for", cx8(hca.GPUDirectNotReady, hca.GPUDirectCauseACS), nil, []resourceapi.DeviceTaint{gpuDirect}},
		{"ready", cx8(hca.GPUDirectReady, ""), nil, nil},
		{"unknown is not a verdict", cx8(hca.GPUDirectUnknown, hca.GPUDirectCauseUnreadable), nil, nil},
		{"no GPU near", cx7(), nil, nil},
		{"port down too: both", down, map[string]metav1.Time{"mlx5-0": since}, []resourceapi.DeviceTaint{portDown, gpuDirect}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := Devices(hca.Inventory{HCAs: []hca.HCA{tc.h}}, Options{TaintedSince: tc.since})[0]
			if diff := cmp.Diff(tc.want, dev.Taints); diff != "" {
				t.Errorf("taints (-want +got):\n%s", diff)
			}
			for _, s := range ResourceSlices("n1", hca.Inventory{HCAs: []hca.HCA{tc.h}}, Options{TaintedSince: tc.since}) {
				validateSlice(t, s)
			}
		})
	}
}
