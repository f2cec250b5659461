package checkpoint

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// movedHCA is an HCA as discovery reports it, every field set.
func movedHCA() hca.HCA {
	return hca.HCA{Identity: hca.Identity{NodeType: "CA", NodeGUID: "a088:c203:0012:3a43", SysImageGUID: "a088:c203:0012:3a40", FirmwareVer: "28.39.2048", HCAType: "MT4129", BoardID: "MT_0000000838", NodeDesc: "node-a mlx5_3", Model: "ConnectX-7"},
		Name: "mlx5_3",

		Ports: []hca.Port{{
			Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: hca.LinkLayerEthernet, RateGbps: 400,
			Width: "4X", Speed: "NDR", LID: 7, SMLID: 1, Netdev: "eth3",
			GIDs: []hca.GID{
				{Index: 0, GID: "fe80:0000:0000:0000:a288:c2ff:fe12:3a43", Type: "IB/RoCE v1", Netdev: "eth3"},
				{Index: 3, GID: "0000:0000:0000:0000:0000:ffff:0a00:0003", Type: "RoCE v2", Netdev: "eth3"},
			},
			RoCEv2GIDIndex: 3,
		}},
		Uverbs: &hca.CharDevice{Name: "uverbs3", Path: "/dev/infiniband/uverbs3", Major: 231, Minor: 195, Exists: true},
		MAD: []hca.CharDevice{
			{Name: "issm3", Path: "/dev/infiniband/issm3", Major: 231, Minor: 67, Port: 1, Exists: true},
			{Name: "umad3", Path: "/dev/infiniband/umad3", Major: 231, Minor: 3, Port: 1},
		},
		PCI: &hca.PCIInfo{
			BusID: "0000:9a:00.0", VendorID: "15b3", DeviceID: "1021", SubsystemVendor: "15b3", SubsystemDevice: "0041",
			Driver: "mlx5_core", NUMANode: 0, PCIeRoot: "pci0000:98", SRIOV: hca.SRIOVVF, NumVFs: 0, PFBusID: "0000:99:00.0",
		},
		Netdevs: []string{"eth3"}, Software: true, ParentNetdev: "eth3",
		Usable: true, UnusableReason: "none", Warnings: []string{"port 1: rate unreadable"},
	}
}

// full is sample plus claims that set every field the format has.
func full() Checkpoint {
	cp := sample()
	cp.Claims["c-uid"] = Claim{
		UID: "c-uid", Namespace: "training", Name: "moved-rdma", PodUIDs: []string{"pod-3"}, Network: "pod",
		Devices: []Device{{
			Request: "rdma", Pool: "node-a", Device: "mlx5-3", IBDev: "mlx5_3", ManagementDevices: true, Env: true,
			PKey: &PKey{Value: 0x8001, Index: 1}, AddressFamily: "IPv4", MoveNetdev: true, Process: Process{Memlock: "268435456", ShmSizeMiB: 8192},
			CDIDeviceIDs: []string{"rdma.dra.dev/hca=c-uid-mlx5-3"}, MovedHCA: SnapshotHCA(movedHCA()),
		}},
		BootID:     "5b1f0a3c-8f0e-4c55-9d8e-0c1f2a3b4c5d",
		PreparedAt: preparedAt.Add(2 * time.Second),
	}
	cp.Claims["d-uid"] = Claim{
		UID: "d-uid", Namespace: "inference", Name: "shared-rdma", PodUIDs: []string{"pod-4"}, Network: "host",
		Devices: []Device{{
			Request: "rdma", Pool: "node-a", Device: "mlx5-4", IBDev: "mlx5_4", ShareID: "share-4", Env: true,
			Limits: &Limits{HCAHandles: 10, HCAObjects: 1000}, AddressFamily: "IPv6", Process: Process{Memlock: "off"},
			CDIDeviceIDs: []string{"rdma.dra.dev/hca=d-uid-mlx5-4-share-4"},
		}},
		BootID:     "5b1f0a3c-8f0e-4c55-9d8e-0c1f2a3b4c5d",
		PreparedAt: preparedAt.Add(3 * time.Second),
	}
	return cp
}

// without is full with the fields a commit did not have zeroed.
func without(fields ...string) Checkpoint {
	cp := full()
	for uid, c := range cp.Claims {
		for _, f := range fields {
			if v := reflect.ValueOf(&c).Elem().FieldByName(f); v.IsValid() {
				v.SetZero()
			}
			for i := range c.Devices {
				if v := reflect.ValueOf(&c.Devices[i]).Elem().FieldByName(f); v.IsValid() {
					v.SetZero()
				}
			}
		}
		cp.Claims[uid] = c
	}
	return cp
}

// TestLoadHistory loads the file each commit that changed the checkpoint's
// shape wrote (testdata/history, by that commit's own Store.Save; see
// generate.sh there) and each loads as what was in it. The last is release
// 0.1.0's shape, with the moved HCA as untagged JSON of hca.HCA.
func TestLoadHistory(t *testing.T) {
	tests := []struct {
		commit string
		want   Checkpoint
	}{
		{"90ce9d3", without("Network", "AddressFamily", "Limits", "PKey", "MoveNetdev", "MovedHCA", "Memlock", "ShmSizeMiB")},
		{"74cc199", without("Limits", "PKey", "MoveNetdev", "MovedHCA", "Memlock", "ShmSizeMiB")},
		{"5f45238", without("PKey", "MoveNetdev", "MovedHCA", "Memlock", "ShmSizeMiB")},
		{"10cdfbf", without("MoveNetdev", "MovedHCA", "Memlock", "ShmSizeMiB")},
		{"9f31080", without("MovedHCA", "Memlock", "ShmSizeMiB")},
		{"b19f53f", without("Memlock", "ShmSizeMiB")},
		{"792488c", full()},
	}
	for _, tt := range tests {
		t.Run(tt.commit, func(t *testing.T) {
			file := filepath.Join("testdata", "history", "checkpoint-v1-"+tt.commit+".json")
			orig, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "checkpoint.json")
			if err := os.WriteFile(path, orig, 0o600); err != nil {
				t.Fatal(err)
			}
			assertEqual(t, mustLoad(t, NewStore(path)), tt.want)
		})
	}
	// The 0.1.0 file really holds the untagged shape this test is about.
	b, err := os.ReadFile(filepath.Join("testdata", "history", "checkpoint-v1-b19f53f.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"Name": "mlx5_3"`)) || !bytes.Contains(b, []byte(`"RoCEv2GIDIndex": 3`)) {
		t.Errorf("checkpoint-v1-b19f53f.json has no untagged movedHCA:\n%s", b)
	}
}

// TestMovedHCAGolden pins the moved-HCA record's JSON: a change here is a
// format change (see HCA's rules), made on purpose with -update.
func TestMovedHCAGolden(t *testing.T) {
	got, err := json.MarshalIndent(SnapshotHCA(movedHCA()), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	golden := filepath.Join("testdata", "moved-hca.golden.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestMovedHCAGolden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the moved-HCA record is\n%s\nbut %s holds\n%s\nIt must stay readable by 0.1.0 (see HCA); if it does, run go test -run TestMovedHCAGolden -update", got, golden, want)
	}
	var back HCA
	if err := json.Unmarshal(want, &back); err != nil {
		t.Fatal(err)
	}
	if h := back.HCA(); !reflect.DeepEqual(h, movedHCA()) {
		t.Errorf("the golden record reads back as\n%+v\nwant\n%+v", h, movedHCA())
	}
}

// TestMovedHCAReadableByRelease010: after a rollback, 0.1.0 decodes the
// record into its untagged hca.HCA (hcaV1Untagged is that shape, frozen).
func TestMovedHCAReadableByRelease010(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "moved-hca.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var old hcaV1Untagged
	if err := json.Unmarshal(b, &old); err != nil {
		t.Fatal(err)
	}
	if got, want := old.convert(), *SnapshotHCA(movedHCA()); !reflect.DeepEqual(got, want) {
		t.Errorf("0.1.0 reads the record as\n%+v\nwant\n%+v", got, want)
	}
}

// TestSnapshotHCACarriesEveryField: a field added to hca.HCA (or its ports,
// GIDs, devices, PCI info) without a place in the record fails here, not
// in a restarted daemon publishing a moved HCA without it.
func TestSnapshotHCACarriesEveryField(t *testing.T) {
	var h hca.HCA
	fillEvery(reflect.ValueOf(&h).Elem(), 1)
	if got := SnapshotHCA(h).HCA(); !reflect.DeepEqual(got, h) {
		t.Errorf("an HCA with every field set comes back from the checkpoint as\n%+v\nwant\n%+v\n(a field of hca.HCA is missing from checkpoint.HCA)", got, h)
	}
}

// fillEvery sets every field under v to a non-zero value.
func fillEvery(v reflect.Value, n int) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fillEvery(v.Field(i), n+i)
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillEvery(v.Elem(), n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fillEvery(v.Index(0), n)
		fillEvery(v.Index(1), n+1)
	case reflect.String:
		v.SetString("s" + string(rune('a'+n%26)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(int64(n + 1))
	case reflect.Uint32, reflect.Uint16, reflect.Uint64:
		v.SetUint(uint64(n + 1))
	case reflect.Float64:
		v.SetFloat(float64(n) + 0.5)
	default:
		panic("fillEvery: no value for kind " + v.Kind().String())
	}
}
