package cdi

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/internal/dirtest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi/cditest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

const (
	uidA = "0f0c3a52-8d35-4f1e-9a55-3b1f1c2d4e5a" // starts with a digit: needs CDI 0.5.0
	uidB = "b7d2e9a4-1c6f-4e8b-8a3d-5f6e7d8c9b0a"
)

// claim describes one claim to write: its HCAs and the options they get.
type claim struct {
	uid   string
	hcas  []hca.HCA
	opts  EditOptions
	group []hca.HCA // nil: the claim's own HCAs
}

// write puts c's spec into dir as the driver does and returns the CDI IDs.
func (c claim) write(t testing.TB, dir string) []string {
	t.Helper()
	var devs []ClaimDevice
	var ids []string
	for _, h := range c.hcas {
		ed, err := DeviceEdits(h, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		name := DeviceName(c.uid, strings.ReplaceAll(h.Name, "_", "-"), "")
		devs = append(devs, ClaimDevice{Name: name, Edits: ed})
		ids = append(ids, QualifiedName(name))
	}
	group := c.group
	if group == nil {
		group = c.hcas
	}
	if err := NewSpecDir(dir).WriteClaim(c.uid, CommonEdits(rdmaCM, group, c.opts), devs); err != nil {
		t.Fatal(err)
	}
	return ids
}

var (
	devCM      = cditest.Node("rdma_cm", 10, 58)
	devUverbs0 = cditest.Node("uverbs0", 231, 192)
	devUverbs1 = cditest.Node("uverbs1", 231, 193)
	ruleCM     = cditest.Rule(10, 58)
	ruleU0     = cditest.Rule(231, 192)
	ruleU1     = cditest.Rule(231, 193)
)

// TestInject checks what a container ends up with, through the CDI library.
func TestInject(t *testing.T) {
	mlx0, mlx1 := ibHCA(0), ibHCA(1)
	env := EditOptions{Env: true}
	union := []hca.HCA{mlx0, mlx1}
	aggregate := []string{"NCCL_IB_HCA==mlx5_0,mlx5_1", "RDMA_DEVICES=mlx5_0,mlx5_1", "UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1"}

	tests := []struct {
		name       string
		claims     []claim
		use        []int // indexes of the claims whose IDs the container gets, in order
		wantDevs   []oci.LinuxDevice
		wantRules  []oci.LinuxDeviceCgroup
		wantEnv    []string
		wantNoPath string
	}{
		{
			name:      "one claim, one HCA, another claim's HCA on the node",
			claims:    []claim{{uid: uidA, hcas: []hca.HCA{mlx0}, opts: env}, {uid: uidB, hcas: []hca.HCA{mlx1}, opts: env}},
			use:       []int{0},
			wantDevs:  []oci.LinuxDevice{devCM, devUverbs0},
			wantRules: []oci.LinuxDeviceCgroup{ruleCM, ruleU0},
			wantEnv: []string{"PATH=/bin", "NCCL_IB_HCA==mlx5_0", "RDMA_DEVICES=mlx5_0", "UCX_NET_DEVICES=mlx5_0:1",
				"RDMA_DEVICE_MLX5_0=/dev/infiniband/uverbs0"},
		},
		{
			name:      "no env",
			claims:    []claim{{uid: uidA, hcas: []hca.HCA{mlx1}}},
			use:       []int{0},
			wantDevs:  []oci.LinuxDevice{devCM, devUverbs1},
			wantRules: []oci.LinuxDeviceCgroup{ruleCM, ruleU1},
			wantEnv:   []string{"PATH=/bin"},
		},
		{
			name:      "management devices",
			claims:    []claim{{uid: uidA, hcas: []hca.HCA{mlx0}, opts: EditOptions{ManagementDevices: true}}},
			use:       []int{0},
			wantDevs:  []oci.LinuxDevice{devCM, cditest.Node("issm0", 231, 64), cditest.Node("umad0", 231, 0), devUverbs0},
			wantRules: []oci.LinuxDeviceCgroup{ruleCM, cditest.Rule(231, 64), cditest.Rule(231, 0), ruleU0},
			wantEnv:   []string{"PATH=/bin"},
		},
		{
			// The runtime applies devices in the order of the IDs it is
			// given, not the order of the spec file.
			name:      "one claim, two HCAs",
			claims:    []claim{{uid: uidA, hcas: []hca.HCA{mlx1, mlx0}, opts: env}},
			use:       []int{0},
			wantDevs:  []oci.LinuxDevice{devCM, devUverbs1, devUverbs0},
			wantRules: []oci.LinuxDeviceCgroup{ruleCM, ruleU1, ruleU0},
			wantEnv: append(append([]string{"PATH=/bin"}, aggregate...),
				"RDMA_DEVICE_MLX5_1=/dev/infiniband/uverbs1", "RDMA_DEVICE_MLX5_0=/dev/infiniband/uverbs0"),
		},
		{
			// Each spec adds rdma_cm: the runtime keeps one node (moved to
			// the end) and two identical cgroup rules.
			name: "two claims in one container",
			claims: []claim{
				{uid: uidA, hcas: []hca.HCA{mlx0}, opts: env, group: union},
				{uid: uidB, hcas: []hca.HCA{mlx1}, opts: env, group: union},
			},
			use:       []int{0, 1},
			wantDevs:  []oci.LinuxDevice{devUverbs0, devCM, devUverbs1},
			wantRules: []oci.LinuxDeviceCgroup{ruleCM, ruleU0, ruleCM, ruleU1},
			wantEnv: append(append([]string{"PATH=/bin"}, aggregate...),
				"RDMA_DEVICE_MLX5_0=/dev/infiniband/uverbs0", "RDMA_DEVICE_MLX5_1=/dev/infiniband/uverbs1"),
		},
		{
			name: "two claims in one container, other order",
			claims: []claim{
				{uid: uidA, hcas: []hca.HCA{mlx0}, opts: env, group: union},
				{uid: uidB, hcas: []hca.HCA{mlx1}, opts: env, group: union},
			},
			use:       []int{1, 0},
			wantDevs:  []oci.LinuxDevice{devUverbs1, devCM, devUverbs0},
			wantRules: []oci.LinuxDeviceCgroup{ruleCM, ruleU1, ruleCM, ruleU0},
			wantEnv: append(append([]string{"PATH=/bin"}, aggregate...),
				"RDMA_DEVICE_MLX5_1=/dev/infiniband/uverbs1", "RDMA_DEVICE_MLX5_0=/dev/infiniband/uverbs0"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			hostRoot := filepath.Join(t.TempDir(), "dev") // no nodes: the runtime must not need them
			var ids [][]string
			for _, c := range tt.claims {
				c.opts.HostDevRoot = hostRoot
				ids = append(ids, c.write(t, dir))
			}
			var use []string
			for _, i := range tt.use {
				use = append(use, ids[i]...)
			}
			s := cditest.Inject(t, dir, use...)
			if diff := cmp.Diff(tt.wantDevs, s.Linux.Devices); diff != "" {
				t.Errorf("Linux.Devices (-want +got):\n%s", diff)
			}
			var rules []oci.LinuxDeviceCgroup
			if s.Linux.Resources != nil {
				rules = s.Linux.Resources.Devices
			}
			if diff := cmp.Diff(tt.wantRules, rules); diff != "" {
				t.Errorf("device cgroup rules (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantEnv, s.Process.Env); diff != "" {
				t.Errorf("Process.Env (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSpecFile checks the file itself: name, mode, version, sorted devices,
// and that the same claim always gives the same bytes.
func TestSpecFile(t *testing.T) {
	dir := t.TempDir()
	c := claim{uid: uidA, hcas: []hca.HCA{ibHCA(1), ibHCA(0)}, opts: EditOptions{Env: true, HostDevRoot: "/sim/dev"}}
	c.write(t, dir)
	d := NewSpecDir(dir)
	path := d.Path(uidA)
	if want := filepath.Join(dir, "rdma.dra.dev-hca_"+uidA+".json"); path != want {
		t.Errorf("Path = %s, want %s", path, want)
	}
	if want := filepath.Join(dir, cdiapi.GenerateTransientSpecName(Vendor, Class, uidA)+".json"); path != want {
		t.Errorf("Path = %s, want the library's transient name %s", path, want)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != 0o644 {
		t.Errorf("mode %v, want 0644", fi.Mode())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var raw cdispec.Spec
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if raw.Version != "0.5.0" || raw.Kind != "rdma.dra.dev/hca" {
		t.Errorf("cdiVersion %q, kind %q", raw.Version, raw.Kind)
	}
	var names []string
	for _, dev := range raw.Devices {
		names = append(names, dev.Name)
	}
	if want := []string{uidA + "-mlx5-0", uidA + "-mlx5-1"}; !slices.Equal(names, want) {
		t.Errorf("devices %v, want %v", names, want)
	}
	spec, err := cdiapi.ReadSpec(path, 0)
	if err != nil {
		t.Fatalf("the CDI library cannot read the file: %v", err)
	}
	if spec.GetDevice(uidA+"-mlx5-0") == nil {
		t.Error("device missing when read by the CDI library")
	}

	// Same claim, devices in another order, another directory: same bytes.
	other := t.TempDir()
	c.hcas = []hca.HCA{ibHCA(0), ibHCA(1)}
	c.write(t, other)
	again, err := os.ReadFile(NewSpecDir(other).Path(uidA))
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(data) {
		t.Errorf("output not deterministic:\n%s\n---\n%s", data, again)
	}
	noTemp(t, dir)
}

func TestWriteClaimIdempotent(t *testing.T) {
	dir := t.TempDir()
	first := claim{uid: uidA, hcas: []hca.HCA{ibHCA(0)}, opts: EditOptions{Env: true}}
	first.write(t, dir)
	before, _ := os.ReadFile(NewSpecDir(dir).Path(uidA))
	first.write(t, dir)
	after, _ := os.ReadFile(NewSpecDir(dir).Path(uidA))
	if string(before) != string(after) {
		t.Errorf("rewrite changed the file:\n%s\n---\n%s", before, after)
	}
	// A rewrite with other devices replaces the file.
	ids := claim{uid: uidA, hcas: []hca.HCA{ibHCA(1)}}.write(t, dir)
	s := cditest.Inject(t, dir, ids...)
	if diff := cmp.Diff([]oci.LinuxDevice{devCM, devUverbs1}, s.Linux.Devices); diff != "" {
		t.Errorf("devices after rewrite (-want +got):\n%s", diff)
	}
	cache, _ := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if got := cache.ListDevices(); !slices.Equal(got, ids) {
		t.Errorf("devices in the dir %v, want only %v", got, ids)
	}
	if uids, _ := NewSpecDir(dir).ClaimUIDs(); !slices.Equal(uids, []string{uidA}) {
		t.Errorf("ClaimUIDs = %v", uids)
	}
	noTemp(t, dir)
}

// TestWriteClaimRejects: bad specs are refused, whether by our checks or
// the CDI library's, and leave the previous file alone and no temp file.
func TestWriteClaimRejects(t *testing.T) {
	good, err := DeviceEdits(ibHCA(0), EditOptions{})
	if err != nil {
		t.Fatal(err)
	}
	zero := CommonEdits(&hca.CharDevice{Name: "rdma_cm"}, nil, EditOptions{})
	relative := CommonEdits(rdmaCM, nil, EditOptions{HostDevRoot: "dev"})
	dev := func(name string, e cdispec.ContainerEdits) []ClaimDevice {
		return []ClaimDevice{{Name: name, Edits: e}}
	}
	tests := []struct {
		name    string
		uid     string
		common  cdispec.ContainerEdits
		devices []ClaimDevice
		wantErr string
	}{
		{name: "no devices", uid: uidA, wantErr: "no devices"},
		{name: "duplicate device", uid: uidA, devices: append(dev("d0", good), dev("d0", good)...), wantErr: `device "d0" given twice`},
		{name: "rdma_cm without number", uid: uidA, common: zero, devices: dev("d0", good), wantErr: "/dev/infiniband/rdma_cm has no device number"},
		{name: "relative host path", uid: uidA, common: relative, devices: dev("d0", good), wantErr: "paths must be absolute"},
		{name: "empty claim UID", uid: "", devices: dev("d0", good), wantErr: "invalid claim UID"},
		{name: "slash in claim UID", uid: "a/b", devices: dev("d0", good), wantErr: "invalid claim UID"},
		// The CDI library's own validation.
		{name: "invalid device name", uid: uidA, devices: dev("-bad", good), wantErr: "rejected by the CDI library"},
		{name: "empty device edits", uid: uidA, devices: dev("d0", cdispec.ContainerEdits{}), wantErr: "empty device edits"},
		{name: "invalid env", uid: uidA, common: cdispec.ContainerEdits{Env: []string{"=x"}}, devices: dev("d0", good), wantErr: "invalid environment variable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			claim{uid: uidA, hcas: []hca.HCA{ibHCA(0)}}.write(t, dir)
			d := NewSpecDir(dir)
			before, _ := os.ReadFile(d.Path(uidA))
			err := d.WriteClaim(tt.uid, tt.common, tt.devices)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
			if tt.uid != "" && !strings.Contains(err.Error(), tt.uid) {
				t.Errorf("error %q does not name the claim", err)
			}
			after, _ := os.ReadFile(d.Path(uidA))
			if string(before) != string(after) {
				t.Error("a refused write changed the claim's file")
			}
			if uids, _ := d.ClaimUIDs(); !slices.Equal(uids, []string{uidA}) {
				t.Errorf("ClaimUIDs = %v", uids)
			}
			noTemp(t, dir)
		})
	}
}

// TestWriteClaimConcurrent: writers of one claim and of other claims never
// leave a partial file or a temp file behind.
func TestWriteClaimConcurrent(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	for i := range 8 {
		uid := []string{uidA, uidB}[i%2]
		h := ibHCA(uint32(i))
		wg.Go(func() {
			ed, err := DeviceEdits(h, EditOptions{Env: true})
			if err != nil {
				t.Error(err)
				return
			}
			dev := []ClaimDevice{{Name: DeviceName(uid, "hca", ""), Edits: ed}}
			if err := NewSpecDir(dir).WriteClaim(uid, CommonEdits(rdmaCM, []hca.HCA{h}, EditOptions{Env: true}), dev); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	cditest.Inject(t, dir, QualifiedName(DeviceName(uidA, "hca", "")), QualifiedName(DeviceName(uidB, "hca", "")))
	if uids, _ := NewSpecDir(dir).ClaimUIDs(); !slices.Equal(uids, []string{uidA, uidB}) {
		t.Errorf("ClaimUIDs = %v", uids)
	}
	noTemp(t, dir)
}

func TestWriteClaimCreatesDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "var", "run", "cdi")
	claim{uid: uidA, hcas: []hca.HCA{ibHCA(0)}}.write(t, dir)
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("spec dir: %v, %v", fi, err)
	}
}

func TestRemoveClaim(t *testing.T) {
	dir := t.TempDir()
	d := NewSpecDir(dir)
	claim{uid: uidA, hcas: []hca.HCA{ibHCA(0)}}.write(t, dir)
	claim{uid: uidB, hcas: []hca.HCA{ibHCA(1)}}.write(t, dir)
	// What a crash or an older format may have left for claim A.
	leftovers := []string{
		"rdma.dra.dev-hca_" + uidA + ".yaml",
		".rdma.dra.dev-hca_" + uidA + ".json.12345.tmp",
	}
	for _, n := range leftovers {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.RemoveClaim(uidA); err != nil {
		t.Fatal(err)
	}
	if names := dirtest.Names(t, dir); !slices.Equal(names, []string{filepath.Base(d.Path(uidB))}) {
		t.Errorf("left in dir: %v, want only claim B's spec", names)
	}
	if err := d.RemoveClaim(uidA); err != nil {
		t.Errorf("removing a missing claim: %v", err)
	}
	if err := NewSpecDir(filepath.Join(dir, "missing")).RemoveClaim(uidA); err != nil {
		t.Errorf("removing from a missing dir: %v", err)
	}
	if err := d.RemoveClaim("../x"); err == nil {
		t.Error("RemoveClaim accepted a UID with a slash")
	}
}

func TestClaimUIDs(t *testing.T) {
	dir := t.TempDir()
	d := NewSpecDir(dir)
	if uids, err := d.ClaimUIDs(); err != nil || len(uids) != 0 {
		t.Errorf("empty dir: %v, %v", uids, err)
	}
	if uids, err := NewSpecDir(filepath.Join(dir, "missing")).ClaimUIDs(); err != nil || len(uids) != 0 {
		t.Errorf("missing dir: %v, %v", uids, err)
	}
	claim{uid: uidB, hcas: []hca.HCA{ibHCA(1)}}.write(t, dir)
	claim{uid: uidA, hcas: []hca.HCA{ibHCA(0)}}.write(t, dir)
	claim{uid: "uid-stale", hcas: []hca.HCA{ibHCA(2)}}.write(t, dir)
	foreign := map[string]string{
		"vendor.example-gpu.json":              `{"cdiVersion":"0.6.0","kind":"vendor.example/gpu","devices":[{"name":"0","containerEdits":{"env":["A=1"]}}]}`,
		"vendor.example-gpu_" + uidA + ".json": `{"cdiVersion":"0.6.0","kind":"vendor.example/gpu","devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}`,
		"random.txt":                           "hello",
		"rdma.dra.dev-hca.json":                `{}`, // a non-transient name: not a claim
		"rdma.dra.dev-hca_.json":               `{}`, // no UID
		"rdma.dra.dev-hca_" + uidB + ".txt":    "",
		".rdma.dra.dev-hca_c.json.1.tmp":       "",
		"rdma.dra.dev-hca_legacy.yaml":         "",
	}
	for n, data := range foreign {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "rdma.dra.dev-hca_subdir.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	uids, err := d.ClaimUIDs()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{uidA, uidB, "legacy", "uid-stale"}; !slices.Equal(uids, want) {
		t.Errorf("ClaimUIDs = %v, want %v", uids, want)
	}
	for _, uid := range uids {
		if err := d.RemoveClaim(uid); err != nil {
			t.Fatal(err)
		}
	}
	for n := range foreign {
		if strings.HasPrefix(n, "rdma.dra.dev-hca_legacy") {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s was touched: %v", n, err)
		}
	}
	if uids, _ := d.ClaimUIDs(); len(uids) != 0 {
		t.Errorf("after removing all: %v", uids)
	}
}

func TestNewSpecDirDefault(t *testing.T) {
	if got := NewSpecDir("").Dir(); got != "/var/run/cdi" {
		t.Errorf("default dir %q", got)
	}
}

func BenchmarkWriteClaim(b *testing.B) {
	for _, n := range []int{1, 8} {
		b.Run(fmt.Sprintf("devices=%d", n), func(b *testing.B) {
			var hcas []hca.HCA
			for i := range n {
				hcas = append(hcas, ibHCA(uint32(i)))
			}
			var devs []ClaimDevice
			for _, h := range hcas {
				ed, err := DeviceEdits(h, EditOptions{Env: true, ManagementDevices: true})
				if err != nil {
					b.Fatal(err)
				}
				devs = append(devs, ClaimDevice{Name: DeviceName(uidA, h.Name, ""), Edits: ed})
			}
			common := CommonEdits(rdmaCM, hcas, EditOptions{Env: true})
			d := NewSpecDir(b.TempDir())
			b.ReportAllocs()
			for b.Loop() {
				if err := d.WriteClaim(uidA, common, devs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func noTemp(t *testing.T, dir string) {
	t.Helper()
	for _, n := range dirtest.Names(t, dir) {
		if strings.HasSuffix(n, ".tmp") || strings.HasPrefix(n, ".") {
			t.Errorf("temporary file left: %s", n)
		}
	}
}

// TestRemoveStaleTemps: only our spec writes' temporary files older than
// the cut go; young ones, spec files, other vendors' files and
// directories stay.
func TestRemoveStaleTemps(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d := NewSpecDir(dir)
	ours := "." + filepath.Base(d.Path("uid-a")) + ".1.tmp"
	now := time.Now()
	for _, tc := range []struct {
		name    string
		age     time.Duration
		dir     bool
		removed bool
	}{
		{name: ours, age: time.Minute, removed: true},
		{name: "." + filepath.Base(d.Path("uid-b")) + ".2.tmp", age: time.Second},
		{name: filepath.Base(d.Path("uid-c")), age: time.Hour},
		{name: ".vendor.example-gpu_x.json.3.tmp", age: time.Hour},
		{name: "." + filepath.Base(d.Path("uid-d")) + ".4.tmp.d", age: time.Hour},
		{name: "." + filepath.Base(d.Path("uid-e")) + ".5.tmp", age: time.Hour, dir: true},
	} {
		p := filepath.Join(dir, tc.name)
		var err error
		if tc.dir {
			err = os.Mkdir(p, 0o755)
		} else {
			err = os.WriteFile(p, []byte("{"), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-tc.age), now.Add(-tc.age)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, err := os.Stat(p)
			if gone := err != nil; gone != tc.removed {
				t.Errorf("%s: removed %v, want %v", tc.name, gone, tc.removed)
			}
		})
	}
	removed, err := d.RemoveStaleTemps(now.Add(-10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{ours}) {
		t.Errorf("removed %v, want [%s]", removed, ours)
	}
	if got, err := NewSpecDir(filepath.Join(dir, "missing")).RemoveStaleTemps(now); err != nil || got != nil {
		t.Errorf("missing dir: %v, %v; want nothing, no error", got, err)
	}
}
