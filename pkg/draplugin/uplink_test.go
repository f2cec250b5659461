package draplugin_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
)

func TestNodeGetter(t *testing.T) {
	t.Parallel()
	node := func(addrs ...corev1.NodeAddress) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}, Status: corev1.NodeStatus{Addresses: addrs}}
	}
	internal := func(ip string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
	}
	tests := []struct {
		name    string
		node    *corev1.Node
		want    []string
		wantErr string
	}{
		{name: "dual stack, other types left out", node: node(corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.9"}, internal("10.0.0.5"), internal("fd00::5")),
			want: []string{"10.0.0.5", "fd00::5"}},
		{name: "IPv4-mapped", node: node(internal("::ffff:10.0.0.5")), want: []string{"10.0.0.5"}},
		{name: "none", node: node()},
		{name: "malformed", node: node(internal("10.0.0")), wantErr: `status.addresses of Node dgx01: InternalIP "10.0.0"`},
		{name: "no Node", wantErr: "reading Node dgx01 for its InternalIP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tt.node != nil {
				client = fake.NewClientset(tt.node)
			}
			got, err := draplugin.NodeGetter{Nodes: client.CoreV1().Nodes(), Name: nodeName}.InternalIPs(context.Background())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var want []netip.Addr
			for _, s := range tt.want {
				want = append(want, netip.MustParseAddr(s))
			}
			if !slices.Equal(got, want) {
				t.Errorf("InternalIPs = %v, want %v", got, want)
			}
		})
	}
}
