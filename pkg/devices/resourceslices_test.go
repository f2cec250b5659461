package devices

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/blang/semver/v4"
	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// sliceNames are the attributes a ResourceSlice carries (docs/attributes.md):
// each used by a documented selector or a stated user story.
var sliceNames = map[resourceapi.QualifiedName]bool{
	d("transport"): true, d("linkLayer"): true, d("model"): true, d("firmwareVersion"): true,
	d("rateGbps"): true, d("netdev"): true, d("sriovVF"): true, d("software"): true,
	d(AttrLegacy): true, pcieRoot: true, numaNode: true,
}

// TestDeviceAttributes: each table entry is every attribute the driver
// knows of the HCA. The slice has those in sliceNames, the metadata file all.
func TestDeviceAttributes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hca    hca.HCA
		netns  hca.NetnsMode
		device string
		want   attrs
	}{{
		name: "InfiniBand ConnectX-7 PF", hca: cx7(), netns: hca.NetnsShared, device: "mlx5-0",
		want: attrs{
			d("ibdev"): str("mlx5_0"), d("transport"): str("ib"), d("linkLayer"): str("InfiniBand"),
			d("model"): str("ConnectX-7"), d("vendorID"): str("15b3"), d("deviceID"): str("1021"),
			d("hcaType"): str("MT4129"), d("firmwareVersion"): semv("28.39.2048"),
			pciBusID: str("0000:16:00.0"), pcieRoot: str("pci0000:15"), numaNode: num(0),
			d("nodeGUID"): str("a088:c203:0012:3a40"), d("sysImageGUID"): str("a088:c203:0012:3a40"),
			d("portState"): str("ACTIVE"), d("physState"): str("LinkUp"), d("rateGbps"): num(400),
			d("ports"): num(1), d("netdev"): str("ibp22s0"), d("sriovVF"): flag(false),
			d("lid"): num(26), d("software"): flag(false), d("netnsMode"): str("shared"),
		},
	}, {
		name: "BlueField-3 RoCE with a GID index", hca: bf3(), netns: hca.NetnsExclusive, device: "mlx5-2",
		want: attrs{
			d("ibdev"): str("mlx5_2"), d("transport"): str("roce"), d("linkLayer"): str("Ethernet"),
			d("model"): str("BlueField-3"), d("vendorID"): str("15b3"), d("deviceID"): str("a2dc"),
			d("hcaType"): str("MT41692"), d("firmwareVersion"): semv("32.41.1000"),
			pciBusID: str("0000:a1:00.0"), pcieRoot: str("pci0000:a0"), numaNode: num(1),
			d("nodeGUID"): str("5c25:7303:00a1:b2c4"), d("sysImageGUID"): str("5c25:7303:00a1:b2c4"),
			d("portState"): str("ACTIVE"), d("physState"): str("LinkUp"), d("rateGbps"): num(200),
			d("ports"): num(1), d("netdev"): str("p0"), d("sriovVF"): flag(false),
			d("roceGIDIndex"): num(3), d("software"): flag(false), d("netnsMode"): str("exclusive"),
		},
	}, {
		name: "RoCE VF without a RoCE v2 GID", hca: vf(), netns: hca.NetnsExclusive, device: "mlx5-4",
		want: attrs{
			d("ibdev"): str("mlx5_4"), d("transport"): str("roce"), d("linkLayer"): str("Ethernet"),
			d("model"): str("ConnectX VF"), d("vendorID"): str("15b3"), d("deviceID"): str("101e"),
			d("hcaType"): str("MT4126"), d("firmwareVersion"): semv("28.39.2048"),
			pciBusID: str("0000:16:00.2"), pcieRoot: str("pci0000:15"), numaNode: num(0),
			d("nodeGUID"): str("0000:0000:0000:0000"), d("sysImageGUID"): str("a088:c203:0012:3a40"),
			d("portState"): str("ACTIVE"), d("physState"): str("LinkUp"), d("rateGbps"): num(400),
			d("ports"): num(1), d("netdev"): str("ens1f0v0"), d("sriovVF"): flag(true),
			d("pfPCIBusID"): str("0000:16:00.0"), d("software"): flag(false), d("netnsMode"): str("exclusive"),
		},
	}, {
		name: "Soft-RoCE", hca: rxe(), netns: hca.NetnsShared, device: "rxe0",
		want: attrs{
			d("ibdev"): str("rxe0"), d("transport"): str("roce"), d("linkLayer"): str("Ethernet"),
			d("model"):    str("Soft-RoCE"),
			d("nodeGUID"): str("5054:00ff:fe12:3456"), d("sysImageGUID"): str("0000:0000:0000:0000"),
			d("portState"): str("ACTIVE"), d("physState"): str("LinkUp"), d("rateGbps"): num(2),
			d("ports"): num(1), d("netdev"): str("eth0"), d("sriovVF"): flag(false),
			d("roceGIDIndex"): num(1), d("software"): flag(true), d("netnsMode"): str("shared"),
		},
	}, {
		name: "NUMA -1, port 1 down, no netdev, unknown netns mode", hca: noNUMA(), device: "mlx5-1",
		want: attrs{
			d("ibdev"): str("mlx5_1"), d("transport"): str("ib"), d("linkLayer"): str("InfiniBand"),
			d("model"): str("ConnectX-6"), d("vendorID"): str("15b3"), d("deviceID"): str("101b"),
			d("hcaType"): str("MT4123"), d("firmwareVersion"): semv("20.35.1012"),
			pciBusID: str("0000:00:05.0"), pcieRoot: str("pci0000:00"),
			d("nodeGUID"): str("0c42:a103:0065:e2f0"), d("sysImageGUID"): str("0c42:a103:0065:e2f0"),
			d("portState"): str("DOWN"), d("physState"): str("Polling"), d("rateGbps"): num(10),
			d("ports"): num(2), d("sriovVF"): flag(false), d("lid"): num(0), d("software"): flag(false),
		},
	}, {
		name: "iWARP RNIC", hca: irdma(), netns: hca.NetnsShared, device: "irdma0",
		want: attrs{
			d("ibdev"): str("irdma0"), d("transport"): str("iwarp"), d("linkLayer"): str("Ethernet"),
			d("model"): str("E810-C"), d("vendorID"): str("8086"), d("deviceID"): str("1592"),
			d("firmwareVersion"): semv("1.70.0"),
			pciBusID:             str("0000:31:00.0"), pcieRoot: str("pci0000:30"), numaNode: num(0),
			d("nodeGUID"): str("b496:91ff:fea1:0000"), d("sysImageGUID"): str("b496:91ff:fea1:0000"),
			d("portState"): str("ACTIVE"), d("physState"): str("LinkUp"), d("rateGbps"): num(100),
			d("ports"): num(1), d("netdev"): str("ens2f0"), d("sriovVF"): flag(false),
			d("software"): flag(false), d("netnsMode"): str("shared"),
		},
	}, {
		name: "garbled fw_ver, no ports", device: "mlx5-9", netns: hca.NetnsShared,
		hca: func() hca.HCA {
			h := cx7()
			h.Name, h.FirmwareVer, h.Ports, h.Netdevs = "mlx5_9", "N/A", nil, nil
			h.PCI.BusID = "0000:16:00.0x" // not BDF: no pciBusID
			return h
		}(),
		want: attrs{
			d("ibdev"): str("mlx5_9"), d("transport"): str("ib"),
			d("model"): str("ConnectX-7"), d("vendorID"): str("15b3"), d("deviceID"): str("1021"),
			d("hcaType"): str("MT4129"), pcieRoot: str("pci0000:15"), numaNode: num(0),
			d("nodeGUID"): str("a088:c203:0012:3a40"), d("sysImageGUID"): str("a088:c203:0012:3a40"),
			d("ports"): num(0), d("sriovVF"): flag(false), d("software"): flag(false), d("netnsMode"): str("shared"),
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			inv := hca.Inventory{HCAs: []hca.HCA{tc.hca}, NetnsMode: tc.netns}
			devs := Devices(inv, Options{})
			if len(devs) != 1 {
				t.Fatalf("got %d devices, want 1", len(devs))
			}
			if devs[0].Name != tc.device {
				t.Errorf("device name %q, want %q", devs[0].Name, tc.device)
			}
			tc.want[d(AttrLegacy)] = flag(false) // every HCA says it is not the legacy device
			inSliceWant := attrs{}
			for k, v := range tc.want {
				if sliceNames[k] {
					inSliceWant[k] = v
				}
			}
			if diff := cmp.Diff(inSliceWant, devs[0].Attributes); diff != "" {
				t.Errorf("slice attributes (-want +got):\n%s", diff)
			}
			// The metadata file has every one, the slice's and the rest.
			md := Metadata(tc.hca, tc.netns, "", Options{})
			for k, v := range tc.want {
				if got, ok := md[string(k)]; !ok || !cmp.Equal(got, v) {
					t.Errorf("metadata %s = %+v (present %v), want %+v", k, got, ok, v)
				}
			}
			if devs[0].Capacity != nil {
				t.Errorf("capacity %v, want none", devs[0].Capacity)
			}
		})
	}
}

func TestDevicesOfNode(t *testing.T) {
	devs := Devices(node(), Options{})
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	// mlx5_3 is unusable.
	want := []string{"irdma0", "mlx5-0", "mlx5-1", "mlx5-2", "mlx5-4", "rxe0"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("device names (-want +got):\n%s", diff)
	}
	pub := Published(node())
	if len(pub) != len(want) {
		t.Errorf("Published has %d HCAs, want %d", len(pub), len(want))
	}
	for _, d := range devs {
		if h, ok := pub[d.Name]; !ok || DeviceName(h.Name) != d.Name {
			t.Errorf("Published[%q] = %q, %v; want the HCA of the device", d.Name, h.Name, ok)
		}
	}
}

func TestDevicesEdgeCases(t *testing.T) {
	t.Run("nothing usable", func(t *testing.T) {
		if devs := Devices(hca.Inventory{HCAs: []hca.HCA{unusable()}}, Options{}); devs != nil {
			t.Errorf("got %v, want no devices", devs)
		}
	})
	t.Run("colliding names keep the first ibdev", func(t *testing.T) {
		a, b, c := cx7(), cx7(), cx7()
		a.Name, b.Name, c.Name = "mlx5_0", "mlx5-0", "MLX5_0"
		for _, order := range [][]hca.HCA{{a, b, c}, {c, b, a}, {b, a, c}} {
			devs := Devices(hca.Inventory{HCAs: order}, Options{})
			if len(devs) != 1 || *Metadata(Published(hca.Inventory{HCAs: order})[devs[0].Name], "", "", Options{})[string(d("ibdev"))].StringValue != "MLX5_0" {
				t.Fatalf("got %+v, want one device for MLX5_0", devs)
			}
			if got := Published(hca.Inventory{HCAs: order})["mlx5-0"].Name; got != "MLX5_0" {
				t.Errorf("Published picked %q, want MLX5_0", got)
			}
		}
	})
	t.Run("ibdev without a valid name", func(t *testing.T) {
		h := cx7()
		h.Name = "__"
		if devs := Devices(hca.Inventory{HCAs: []hca.HCA{h, rxe()}}, Options{}); len(devs) != 1 || devs[0].Name != "rxe0" {
			t.Errorf("got %+v, want only rxe0", devs)
		}
	})
	t.Run("driver name is the attribute domain", func(t *testing.T) {
		devs := Devices(hca.Inventory{HCAs: []hca.HCA{cx7()}}, Options{DriverName: "rdma.example.com"})
		for name := range devs[0].Attributes {
			if !strings.HasPrefix(string(name), "rdma.example.com/") && !strings.HasPrefix(string(name), "resource.kubernetes.io/") {
				t.Errorf("attribute %q is in neither the driver's nor the standard domain", name)
			}
		}
		if _, ok := devs[0].Attributes["rdma.example.com/linkLayer"]; !ok {
			t.Errorf("no rdma.example.com/linkLayer in %v", devs[0].Attributes)
		}
	})
	t.Run("odd rates", func(t *testing.T) {
		for _, tc := range []struct {
			rate float64
			want *int64
		}{{2.5, ptr(int64(2))}, {0, ptr(int64(0))}, {53.125, ptr(int64(53))}, {-1, nil}, {math.NaN(), nil}, {math.Inf(1), nil}} {
			h := cx7()
			h.Ports[0].RateGbps = tc.rate
			got := Devices(hca.Inventory{HCAs: []hca.HCA{h}}, Options{})[0].Attributes[d("rateGbps")].IntValue
			if !cmp.Equal(got, tc.want) {
				t.Errorf("rate %v: rateGbps %v, want %v", tc.rate, deref(got), deref(tc.want))
			}
		}
	})
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestDeviceName(t *testing.T) {
	long := strings.Repeat("a", 62) + "_b" + strings.Repeat("c", 10)
	for in, want := range map[string]string{
		"mlx5_0":   "mlx5-0",
		"MLX5_10":  "mlx5-10",
		"rxe0":     "rxe0",
		"siw_eth0": "siw-eth0",
		"bnxt_re0": "bnxt-re0",
		"ib.dev@1": "ib-dev-1",
		"_mlx5_0_": "mlx5-0",
		"a__b":     "a--b",
		"ïb0":      "b0",
		"___":      "",
		"":         "",
		long:       strings.Repeat("a", 62),
	} {
		got := DeviceName(in)
		if got != want {
			t.Errorf("DeviceName(%q) = %q, want %q", in, got, want)
		}
		if got != "" {
			if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
				t.Errorf("DeviceName(%q) = %q: %v", in, got, errs)
			}
		}
	}
}

func FuzzDeviceName(f *testing.F) {
	for _, s := range []string{"mlx5_0", "rxe0", "A-", strings.Repeat("x_", 40), "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ibdev string) {
		name := DeviceName(ibdev)
		if name == "" {
			return
		}
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Fatalf("DeviceName(%q) = %q: %v", ibdev, name, errs)
		}
		if again := DeviceName(name); again != name {
			t.Fatalf("DeviceName(%q) = %q, but DeviceName(%q) = %q", ibdev, name, name, again)
		}
	})
}

// strictVersion is the subset of semver 2.0 that firmwareVersion produces.
var strictVersion = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(\+(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))*)?$`)

func TestFirmwareVersion(t *testing.T) {
	for in, want := range map[string]string{
		"28.39.2048":                       "28.39.2048", // mlx5
		"16.035.4030":                      "16.35.4030", // mlx5 prints the minor zero-padded
		"2.42.5000":                        "2.42.5000",  // mlx4
		"1.70":                             "1.70.0",     // irdma
		"7":                                "7.0.0",
		"0.0.0":                            "0.0.0",
		"00.000.0000":                      "0.0.0",
		"218.0.169.0":                      "218.0.169+0", // bnxt_re
		"8.59.1.0":                         "8.59.1+0",    // qedr
		"1.2.3.04.5":                       "1.2.3+4.5",
		" 28.39.2048\n":                    "28.39.2048",
		"18446744073709551615.0.0":         "18446744073709551615.0.0",
		"1.2.3." + strings.Repeat("9", 70): "1.2.3", // build metadata too long for 64 bytes
		// Not a version: no attribute.
		"":                          "",
		"N/A":                       "",
		"28.39.2048-rc1":            "",
		"28.39.2048+1":              "",
		"v28.39.2048":               "",
		"28..2048":                  "",
		".28.39":                    "",
		"28.39.":                    "",
		"28.39.2048 (MT_000000083)": "",
		"١.٢.٣":                     "", // Arabic-Indic digits are not ASCII
		"18446744073709551616.0.0":  "", // does not fit in 64 bits
		"-1.0.0":                    "",
	} {
		got, ok := firmwareVersion(in)
		if got != want || ok != (want != "") {
			t.Errorf("firmwareVersion(%q) = %q, %v; want %q", in, got, ok, want)
			continue
		}
		if !ok {
			continue
		}
		if _, err := semver.Parse(got); err != nil {
			t.Errorf("firmwareVersion(%q) = %q, which the scheduler's semver parser rejects: %v", in, got, err)
		}
		if !strictVersion.MatchString(got) || len(got) > resourceapi.DeviceAttributeMaxValueLength {
			t.Errorf("firmwareVersion(%q) = %q is not a valid version attribute", in, got)
		}
	}
}

func FuzzFirmwareVersion(f *testing.F) {
	for _, s := range []string{"28.39.2048", "16.035.4030", "218.0.169.0", "1.70", "", "x.y.z", "1..2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, fw string) {
		v, ok := firmwareVersion(fw)
		if !ok {
			return
		}
		if _, err := semver.Parse(v); err != nil {
			t.Fatalf("firmwareVersion(%q) = %q: %v", fw, v, err)
		}
		if !strictVersion.MatchString(v) || len(v) > resourceapi.DeviceAttributeMaxValueLength {
			t.Fatalf("firmwareVersion(%q) = %q is not a valid version attribute", fw, v)
		}
	})
}

func TestAttributeLimit(t *testing.T) {
	// The richest HCA: every optional field set, a VF on RoCE with a GID
	// index, so that pfPCIBusID and roceGIDIndex are both there.
	h := vf()
	h.Ports[0].RoCEv2GIDIndex = 2
	h.FirmwareVer = "28.39.2048.1"
	// Every data path field: a Data Direct card whose GPUDirect is not ready.
	h.DataPath = &hca.DataPath{Function: "0008:03:00.0", DataDirect: true, PCIeRoot: "pci0008:00",
		GPUs: []string{"0008:06:00.0"}, GPULink: hca.GPULinkSwitch, Shared: "0008:01:00.0", Board: "MT2516X00000",
		GPUDirect: hca.GPUDirectNotReady, GPUDirectCause: hca.GPUDirectCauseACS}
	inv := hca.Inventory{HCAs: []hca.HCA{h}, NetnsMode: hca.NetnsShared}
	got := Devices(inv, Options{DriverName: strings.Repeat("d", 63), Shares: 10, HCAHandles: 1, HCAObjects: 1})[0]
	n := len(got.Attributes) + len(got.Capacity)
	if n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		t.Fatalf("richest device has %d attributes and capacities, limit %d", n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
	}
	// Every slice attribute (the eight driver ones, legacy, pcieRoot and
	// numaNode) and the three capacities of shared mode with limits.
	if want := len(sliceNames) + 3; n != want {
		t.Errorf("richest device has %d attributes and capacities, want %d: %v", n, want, got.Attributes)
	}
	t.Logf("richest device: %d of %d attributes and capacities", n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
	// The metadata file has every driver attribute but lid (InfiniBand
	// only), legacy and the three standard ones.
	md := Metadata(h, inv.NetnsMode, "", Options{})
	for i, id := range attrIDs {
		if _, ok := md["rdma.dra.dev/"+id]; !ok && attr(i) != attrLID {
			t.Errorf("metadata has no %s", id)
		}
	}

	// Past the limit, the first attributes put are the ones kept.
	s := attrSet{m: attrs{}, keep: map[resourceapi.QualifiedName]bool{}}
	for i := range maxAttributes + 5 {
		s.keep[resourceapi.QualifiedName(fmt.Sprintf("a%02d", i))] = true
	}
	for i := range maxAttributes + 5 {
		s.putInt(resourceapi.QualifiedName(fmt.Sprintf("a%02d", i)), int64(i))
	}
	if len(s.m) != maxAttributes {
		t.Fatalf("attrSet holds %d, want %d", len(s.m), maxAttributes)
	}
	if _, ok := s.m[resourceapi.QualifiedName(fmt.Sprintf("a%02d", maxAttributes-1))]; !ok {
		t.Errorf("attrSet dropped an attribute put before the limit")
	}
}

// TestInSlice: the exported check agrees with what Devices publishes.
func TestInSlice(t *testing.T) {
	for name := range Metadata(vf(), hca.NetnsShared, "", Options{}) {
		if got, want := InSlice(name, Options{}), sliceNames[resourceapi.QualifiedName(name)]; got != want {
			t.Errorf("InSlice(%s) = %v, want %v", name, got, want)
		}
	}
}

func TestResourcesSplit(t *testing.T) {
	inv := syntheticInventory(300)
	res := Resources("node-1", inv, Options{})
	if len(res.Pools) != 1 {
		t.Fatalf("got %d pools, want 1", len(res.Pools))
	}
	pool, ok := res.Pools["node-1"]
	if !ok {
		t.Fatalf("no pool named after the node: %v", res.Pools)
	}
	var sizes []int
	var names []string
	for _, s := range pool.Slices {
		sizes = append(sizes, len(s.Devices))
		for _, d := range s.Devices {
			names = append(names, d.Name)
		}
	}
	if diff := cmp.Diff([]int{128, 128, 44}, sizes); diff != "" {
		t.Errorf("slice sizes (-want +got):\n%s", diff)
	}
	if !isSorted(names) || len(names) != 300 {
		t.Errorf("%d device names, sorted %v; want 300 sorted", len(names), isSorted(names))
	}
	if names[0] != "mlx5-0" || names[1] != "mlx5-1" || names[2] != "mlx5-10" {
		t.Errorf("names start %v, want byte order", names[:3])
	}

	rs := ResourceSlices("node-1", inv, Options{})
	if len(rs) != 3 {
		t.Fatalf("got %d ResourceSlices, want 3", len(rs))
	}
	for i, s := range rs {
		if want := fmt.Sprintf("node-1-rdma-dra-dev-%d", i); s.Name != want {
			t.Errorf("slice %d is named %q, want %q", i, s.Name, want)
		}
		if s.APIVersion != "resource.k8s.io/v1" || s.Kind != "ResourceSlice" {
			t.Errorf("slice %d is %s %s", i, s.APIVersion, s.Kind)
		}
		want := resourceapi.ResourcePool{Name: "node-1", Generation: 1, ResourceSliceCount: 3}
		if s.Spec.Driver != "rdma.dra.dev" || s.Spec.NodeName == nil || *s.Spec.NodeName != "node-1" || s.Spec.Pool != want {
			t.Errorf("slice %d spec: driver %q, node %v, pool %+v", i, s.Spec.Driver, s.Spec.NodeName, s.Spec.Pool)
		}
		if diff := cmp.Diff(pool.Slices[i].Devices, s.Spec.Devices); diff != "" {
			t.Errorf("slice %d differs from Resources (-resources +slices):\n%s", i, diff)
		}
		validateSlice(t, s)
	}
}

func isSorted(s []string) bool {
	for i := 1; i < len(s); i++ {
		if s[i-1] >= s[i] {
			return false
		}
	}
	return true
}

func TestEmptyInventory(t *testing.T) {
	res := Resources("node-1", hca.Inventory{HCAs: []hca.HCA{unusable()}}, Options{})
	pool, ok := res.Pools["node-1"]
	if !ok || len(pool.Slices) != 1 || len(pool.Slices[0].Devices) != 0 {
		t.Errorf("got %+v, want one pool with one empty slice", res)
	}
	rs := ResourceSlices("node-1", hca.Inventory{}, Options{})
	if len(rs) != 1 || len(rs[0].Spec.Devices) != 0 || rs[0].Spec.Pool.ResourceSliceCount != 1 {
		t.Fatalf("got %+v, want one empty ResourceSlice", rs)
	}
	validateSlice(t, rs[0])
}

func TestSliceName(t *testing.T) {
	long := strings.Repeat("n", 237) + ".example.com" // cut after the dot
	for _, tc := range []struct{ node, driver, want string }{
		{"node-1", "rdma.dra.dev", "node-1-rdma-dra-dev-0"},
		{"gpu01.cluster.local", "rdma.example.com", "gpu01.cluster.local-rdma-example-com-0"},
		{long, "rdma.dra.dev", strings.Repeat("n", 237) + "-rdma-dra-dev-0"},
	} {
		got := sliceName(tc.node, tc.driver, 0)
		if got != tc.want {
			t.Errorf("sliceName(%q, %q) = %q, want %q", tc.node, tc.driver, got, tc.want)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("sliceName(%q, %q) = %q: %v", tc.node, tc.driver, got, errs)
		}
	}
}

func TestDeterministic(t *testing.T) {
	for _, inv := range []hca.Inventory{node(), syntheticInventory(200)} {
		want := render(t, inv)
		rng := rand.New(rand.NewPCG(1, 2))
		for range 20 {
			shuffled := inv
			shuffled.HCAs = append([]hca.HCA(nil), inv.HCAs...)
			rng.Shuffle(len(shuffled.HCAs), func(i, j int) {
				shuffled.HCAs[i], shuffled.HCAs[j] = shuffled.HCAs[j], shuffled.HCAs[i]
			})
			if got := render(t, shuffled); got != want {
				t.Fatalf("shuffled input gives different output:\n%s", cmp.Diff(want, got))
			}
			if a, b := Resources("n", inv, Options{}), Resources("n", shuffled, Options{}); !reflect.DeepEqual(a, b) {
				t.Fatalf("shuffled input gives different resources:\n%s", cmp.Diff(a, b))
			}
		}
	}
}

func render(t *testing.T, inv hca.Inventory) string {
	t.Helper()
	b, err := json.Marshal(ResourceSlices("node-1", inv, Options{}))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSlicesOfNodeAreValid(t *testing.T) {
	for _, opts := range []Options{{}, {DriverName: "rdma.example.com"}} {
		for _, s := range ResourceSlices("dgx01.cluster.local", node(), opts) {
			validateSlice(t, s)
		}
	}
}

// validateSlice checks what the apiserver checks of a ResourceSlice's
// names, attributes and sizes. The apiserver's own validation lives in
// k8s.io/kubernetes, which this module must not import; the test/ module
// runs the real thing. Version values are parsed with blang/semver, the
// parser of the scheduler's CEL environment.
func validateSlice(t *testing.T, s resourceapi.ResourceSlice) {
	t.Helper()
	errorf := func(format string, args ...any) {
		t.Helper()
		t.Errorf("slice %q: %s", s.Name, fmt.Sprintf(format, args...))
	}
	for what, errs := range map[string][]string{
		"name":   validation.IsDNS1123Subdomain(s.Name),
		"driver": validation.IsDNS1123Subdomain(s.Spec.Driver),
		"pool":   validation.IsDNS1123Subdomain(s.Spec.Pool.Name),
	} {
		if len(errs) > 0 {
			errorf("%s: %v", what, errs)
		}
	}
	if len(s.Spec.Driver) > resourceapi.DeviceMaxDomainLength {
		errorf("driver name longer than %d", resourceapi.DeviceMaxDomainLength)
	}
	if s.Spec.NodeName == nil || len(validation.IsDNS1123Subdomain(*s.Spec.NodeName)) > 0 {
		errorf("node name %v", s.Spec.NodeName)
	}
	if s.Spec.Pool.ResourceSliceCount <= 0 || s.Spec.Pool.Generation < 0 {
		errorf("pool %+v", s.Spec.Pool)
	}
	if len(s.Spec.Devices) > resourceapi.ResourceSliceMaxDevices {
		errorf("%d devices", len(s.Spec.Devices))
	}
	seen := map[string]bool{}
	for _, dev := range s.Spec.Devices {
		if errs := validation.IsDNS1123Label(dev.Name); len(errs) > 0 {
			errorf("device name %q: %v", dev.Name, errs)
		}
		if seen[dev.Name] {
			errorf("device %q twice", dev.Name)
		}
		seen[dev.Name] = true
		if n := len(dev.Attributes) + len(dev.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
			errorf("device %q: %d attributes and capacities", dev.Name, n)
		}
		for name, a := range dev.Attributes {
			domain, id, ok := strings.Cut(string(name), "/")
			if !ok {
				id, domain = domain, ""
			}
			if ok && (len(validation.IsDNS1123Subdomain(domain)) > 0 || len(domain) > resourceapi.DeviceMaxDomainLength) {
				errorf("device %q: attribute %q: bad domain", dev.Name, name)
			}
			if errs := validation.IsCIdentifier(id); len(errs) > 0 || len(id) > resourceapi.DeviceMaxIDLength {
				errorf("device %q: attribute %q: %v", dev.Name, name, errs)
			}
			if err := checkValue(a); err != nil {
				errorf("device %q: attribute %q: %v", dev.Name, name, err)
			}
		}
	}
}

func checkValue(a resourceapi.DeviceAttribute) error {
	set := 0
	for _, p := range []bool{a.IntValue != nil, a.BoolValue != nil, a.StringValue != nil, a.VersionValue != nil,
		a.IntValues != nil, a.BoolValues != nil, a.StringValues != nil, a.VersionValues != nil} {
		if p {
			set++
		}
	}
	switch {
	case set != 1:
		return fmt.Errorf("%d values set, want exactly one", set)
	case a.StringValue != nil && (*a.StringValue == "" || len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength):
		return fmt.Errorf("string %q empty or too long", *a.StringValue)
	case a.VersionValue != nil:
		if len(*a.VersionValue) > resourceapi.DeviceAttributeMaxValueLength {
			return fmt.Errorf("version %q too long", *a.VersionValue)
		}
		if _, err := semver.Parse(*a.VersionValue); err != nil {
			return fmt.Errorf("version %q: %w", *a.VersionValue, err)
		}
	}
	return nil
}

// TestDocumented keeps docs/attributes.md and the code in step: every
// attribute the code can publish has a row in the contract table.
func TestDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/attributes.md")
	if err != nil {
		t.Fatal(err)
	}
	names := append([]string(nil), attrIDs[:]...)
	names = append(names, string(pciBusID), string(pcieRoot), string(numaNode))
	for _, n := range names {
		if !strings.Contains(string(doc), "| `"+n+"` |") {
			t.Errorf("docs/attributes.md has no table row for `%s`", n)
		}
	}
	for i, id := range attrIDs {
		if id == "" {
			t.Errorf("attribute %d has no name", i)
		}
	}
}

func BenchmarkDevices(b *testing.B) {
	inv := syntheticInventory(64)
	b.ReportAllocs()
	for b.Loop() {
		if devs := Devices(inv, Options{}); len(devs) != 64 {
			b.Fatalf("got %d devices", len(devs))
		}
	}
}

func TestSharedAndLegacyDevices(t *testing.T) {
	inv := hca.Inventory{HCAs: []hca.HCA{cx7(), bf3()}, NetnsMode: hca.NetnsShared}
	devs := Devices(inv, Options{Shares: 1000, LegacyShares: 1000})
	var names []string
	for _, dev := range devs {
		names = append(names, dev.Name)
		if dev.AllowMultipleAllocations == nil || !*dev.AllowMultipleAllocations {
			t.Errorf("%s: not multi-allocatable in shared mode", dev.Name)
		}
		c, ok := dev.Capacity[d(CapacityShares)]
		if !ok || c.Value.Value() != 1000 || c.RequestPolicy == nil || c.RequestPolicy.Default.Value() != 1 {
			t.Errorf("%s: shares capacity = %+v", dev.Name, c)
		}
		legacy := *dev.Attributes[d(AttrLegacy)].BoolValue
		if legacy != (dev.Name == LegacyDeviceName) {
			t.Errorf("%s: legacy = %v", dev.Name, legacy)
		}
	}
	if want := "legacy-rdma-hca mlx5-0 mlx5-2"; strings.Join(names, " ") != want {
		t.Errorf("devices %v, want %v", names, want)
	}
	if n := *devs[0].Attributes[d(AttrHCAs)].IntValue; n != 2 {
		t.Errorf("legacy device stands for %d HCAs, want 2", n)
	}
	for _, dev := range Devices(inv, Options{}) {
		if dev.AllowMultipleAllocations != nil || dev.Capacity != nil || dev.Name == LegacyDeviceName {
			t.Errorf("exclusive mode published %s as shared or legacy", dev.Name)
		}
	}
}

func TestPortDownTaint(t *testing.T) {
	since := metav1.NewTime(time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC))
	down := cx7()
	down.Ports[0].State, down.Ports[0].PhysState = "DOWN", "Polling"
	up := bf3()
	inv := hca.Inventory{HCAs: []hca.HCA{down, up}}
	devs := Devices(inv, Options{TaintedSince: map[string]metav1.Time{"mlx5-0": since}})
	want := []resourceapi.DeviceTaint{{Key: "rdma.dra.dev/port-down", Value: "DOWN", Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &since}}
	if diff := cmp.Diff(want, devs[0].Taints); diff != "" {
		t.Errorf("taints of the DOWN HCA (-want +got):\n%s", diff)
	}
	if len(devs[1].Taints) != 0 {
		t.Errorf("healthy HCA tainted: %v", devs[1].Taints)
	}
	// Without a time from the caller nothing is tainted (taints are opt-in).
	if d := Devices(inv, Options{}); len(d[0].Taints) != 0 {
		t.Errorf("taints without TaintedSince: %v", d[0].Taints)
	}
}

func TestTaintedSlicesHoldAtMost64(t *testing.T) {
	var inv hca.Inventory
	since := map[string]metav1.Time{}
	for i := range 100 {
		h := cx7()
		h.Name = fmt.Sprintf("mlx5_%d", i)
		if i == 7 {
			h.Ports[0].State = "DOWN"
			since[DeviceName(h.Name)] = metav1.Now()
		}
		inv.HCAs = append(inv.HCAs, h)
	}
	res := Resources("n1", inv, Options{TaintedSince: since})
	var sizes []int
	for _, s := range res.Pools["n1"].Slices {
		sizes = append(sizes, len(s.Devices))
	}
	if fmt.Sprint(sizes) != "[64 36]" {
		t.Errorf("slice sizes with a tainted device = %v, want [64 36]", sizes)
	}
}
