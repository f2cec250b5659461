package devices

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

func TestAttributeString(t *testing.T) {
	str := func(s string) *string { return &s }
	i := func(v int64) *int64 { return &v }
	b := func(v bool) *bool { return &v }
	for _, tc := range []struct {
		name string
		a    resourceapi.DeviceAttribute
		want string
	}{
		{"string", resourceapi.DeviceAttribute{StringValue: str("mlx5_0")}, "mlx5_0"},
		{"empty string", resourceapi.DeviceAttribute{StringValue: str("")}, ""},
		{"int", resourceapi.DeviceAttribute{IntValue: i(400)}, "400"},
		{"negative int", resourceapi.DeviceAttribute{IntValue: i(-1)}, "-1"},
		{"bool true", resourceapi.DeviceAttribute{BoolValue: b(true)}, "true"},
		{"bool false", resourceapi.DeviceAttribute{BoolValue: b(false)}, "false"},
		{"version", resourceapi.DeviceAttribute{VersionValue: str("28.39.1002")}, "28.39.1002"},
		{"empty attribute", resourceapi.DeviceAttribute{}, "-"},
	} {
		if got := AttributeString(tc.a); got != tc.want {
			t.Errorf("%s: AttributeString(%+v) = %q, want %q", tc.name, tc.a, got, tc.want)
		}
	}
}
