package hca_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

func TestPKeys(t *testing.T) {
	spec, err := hcatest.Preset("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	spec.HCAs[1].Corrupt = map[string]string{"ports/1/pkeys/5": "0xzzzz"}
	node, err := hcatest.Build(filepath.Join(t.TempDir(), "n"), spec)
	if err != nil {
		t.Fatal(err)
	}
	d := hca.NewDiscoverer(hca.WithSysfsRoot(node.SysfsRoot), hca.WithDevRoot(node.DevRoot), hca.WithReadFile(node.ReadFile))
	tests := []struct {
		ibdev   string
		port    int
		want    []hca.PKey
		wantErr string
	}{
		{ibdev: "mlx5_0", port: 1, want: []hca.PKey{{Index: 0, Value: 0xffff}, {Index: 1, Value: 0x8001}}},
		{ibdev: "mlx5_8", port: 1, want: []hca.PKey{{Index: 0, Value: 0xffff}}},
		{ibdev: "mlx5_1", port: 1, wantErr: `pkeys/5: want a P_Key of 1 to 4 hex digits such as "0x8001", got "0xzzzz"`},
		{ibdev: "mlx5_0", port: 2, wantErr: "HCA mlx5_0 port 2"},
		{ibdev: "mlx5_42", port: 1, wantErr: "HCA mlx5_42 port 1"},
	}
	for _, tt := range tests {
		got, err := d.PKeys(tt.ibdev, tt.port)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("PKeys(%s, %d) error %v, want one containing %q", tt.ibdev, tt.port, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("PKeys(%s, %d) = %v, %v; want %v", tt.ibdev, tt.port, got, err, tt.want)
		}
	}
}

func TestFindPKey(t *testing.T) {
	table := []hca.PKey{{0, 0xffff}, {1, 0x0002}, {2, 0x8001}, {3, 0x8002}}
	tests := []struct {
		want    uint16
		index   int
		matched bool
	}{
		{0x8001, 2, true},  // full member asked, full member there
		{0x0001, 2, true},  // limited asked: a full entry serves
		{0x0002, 1, true},  // the lowest index of the partition
		{0x8002, 3, true},  // full asked: the limited entry at 1 does not do
		{0x7fff, 0, true},  // the default partition
		{0x8005, 0, false}, // absent
	}
	for _, tt := range tests {
		i, ok := hca.FindPKey(table, tt.want)
		if i != tt.index || ok != tt.matched {
			t.Errorf("FindPKey(%#04x) = %d, %v; want %d, %v", tt.want, i, ok, tt.index, tt.matched)
		}
	}
}
