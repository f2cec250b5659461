package main

import (
	"slices"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

func TestUnseenNetdevs(t *testing.T) {
	inv := hca.Inventory{HCAs: []hca.HCA{
		{Name: "rxe0", Netdevs: []string{"lo"}},
		{Name: "mlx5_0", Netdevs: []string{"rdmatest-none0", "lo"}},
		{Name: "mlx5_1"}, // InfiniBand without IPoIB: nothing to see
	}}
	if got := unseenNetdevs(inv); !slices.Equal(got, []string{"rdmatest-none0"}) {
		t.Errorf("unseen = %v, want [rdmatest-none0] (lo exists in every namespace)", got)
	}
}
