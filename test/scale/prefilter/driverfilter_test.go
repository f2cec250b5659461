package prefilter

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

func TestPinnedDriver(t *testing.T) {
	for _, tc := range []struct {
		expr, want string
	}{
		{`device.driver == "rdma.dra.dev"`, "rdma.dra.dev"},
		{`device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'`, "gpu.nvidia.com"},
		{"device.driver == \"rdma.dra.dev\" &&\ndevice.attributes[\"rdma.dra.dev\"].legacy == false", "rdma.dra.dev"},
		{`  device.driver=="a.example.com"  `, "a.example.com"},
		// An || or ?: may make the equality one branch of several.
		{`device.driver == "a.example.com" || device.driver == "b.example.com"`, ""},
		{`device.driver == "a.example.com" && x || true`, ""},
		{`device.driver == "a.example.com" ? true : true`, ""},
		// The equality is not the first operand, or not the whole operand.
		{`true && device.driver == "a.example.com"`, ""},
		{`device.driver == "a" + ".example.com"`, ""},
		{`device.driver == "A.example.com".lowerAscii()`, ""},
		{`device.driver != "a.example.com"`, ""},
		{`!(device.driver == "a.example.com")`, ""},
		{`device.driver == r"a.example.com"`, ""},
		{`device.driver == "a\".example.com"`, ""},
		{`device.attributes["a.example.com"].x == 1`, ""},
		{``, ""},
	} {
		if got := pinnedDriver(tc.expr); got != tc.want {
			t.Errorf("pinnedDriver(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

func TestClassAdmitsDriver(t *testing.T) {
	class := func(exprs ...string) *resourceapi.DeviceClass {
		c := &resourceapi.DeviceClass{}
		for _, e := range exprs {
			c.Spec.Selectors = append(c.Spec.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
		}
		return c
	}
	for _, tc := range []struct {
		name   string
		class  *resourceapi.DeviceClass
		driver string
		want   bool
	}{
		{"no selectors", class(), "any.example.com", true},
		{"pinned, same driver", class(`device.driver == "rdma.dra.dev"`), "rdma.dra.dev", true},
		{"pinned, other driver", class(`device.driver == "rdma.dra.dev"`), "gpu.nvidia.com", false},
		{"second selector pins", class(`device.attributes["x"].y == 1`, `device.driver == "rdma.dra.dev"`), "gpu.nvidia.com", false},
		{"nothing pinned", class(`device.driver == "a" || device.driver == "b"`), "b", true},
	} {
		if got := classAdmitsDriver(tc.class, tc.driver); got != tc.want {
			t.Errorf("%s: classAdmitsDriver(%q) = %v, want %v", tc.name, tc.driver, got, tc.want)
		}
	}
}
