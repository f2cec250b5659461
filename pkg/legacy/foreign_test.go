package legacy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestForeignAdvertiser(t *testing.T) {
	node := func(alloc string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dgx01"}}
		n.Status.Allocatable = corev1.ResourceList{"cpu": resource.MustParse("64")}
		if alloc != "" {
			n.Status.Allocatable["rdma/hca"] = resource.MustParse(alloc)
		}
		return n
	}
	tests := []struct {
		name           string
		node           *corev1.Node
		route, sharing string
		want           string // substring; "" means no problem
	}{
		{name: "dra route, old plugin still advertising", node: node("1k"), route: LegacyDRA, sharing: "shared", want: "advertises rdma/hca=1k from a device plugin: the scheduler gives rdma/hca pods"},
		{name: "off, exclusive, old plugin", node: node("1000"), route: LegacyOff, sharing: "exclusive", want: "claims here are not exclusive"},
		{name: "off, shared, old plugin: both share", node: node("1000"), route: LegacyOff, sharing: "shared"},
		{name: "own device-plugin route", node: node("1000"), route: LegacyDevicePlugin, sharing: "shared"},
		{name: "plugin gone, allocatable 0", node: node("0"), route: LegacyDRA, sharing: "shared"},
		{name: "never advertised", node: node(""), route: LegacyOff, sharing: "exclusive"},
		{name: "no node", node: nil, route: LegacyDRA, sharing: "shared"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ForeignAdvertiser(tt.node, "rdma/hca", tt.route, tt.sharing)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
