package v1alpha1

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzDecode feeds arbitrary parameters to Decode and DecodeYAML: neither
// may panic, an error must say something, and an accepted config must
// validate and survive re-encoding as JSON unchanged. The seed corpus is
// testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","managementDevices":true,"env":false}`))
	f.Add([]byte("apiVersion: rdma.dra.dev/v1alpha1\nkind: HcaConfig\nenv: false\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, decode := range []func([]byte) (*HcaConfig, error){Decode, DecodeYAML} {
			c, err := decode(raw)
			if err != nil {
				if c != nil || err.Error() == "" {
					t.Fatalf("decoding %q = %v, %q", raw, c, err)
				}
				continue
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("decoding %q accepted a config that does not validate: %v", raw, err)
			}
			enc, err := json.Marshal(c)
			if err != nil {
				t.Fatalf("re-encoding %+v: %v", c, err)
			}
			again, err := Decode(enc)
			if err != nil {
				t.Fatalf("decoding %q accepted, but its re-encoding %s fails: %v", raw, enc, err)
			}
			if !reflect.DeepEqual(c, again) {
				t.Fatalf("decoding %q = %s, but its re-encoding decodes to %s", raw, show(c), show(again))
			}
		}
	})
}
