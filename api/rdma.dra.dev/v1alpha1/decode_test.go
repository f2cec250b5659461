package v1alpha1

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var typeMeta = metav1.TypeMeta{APIVersion: APIVersion, Kind: Kind}

// minimal is the smallest valid config.
const minimal = `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig"}`

// decodeCase is a document Decode reads and what it must make of it.
type decodeCase struct {
	name    string
	in      string
	yaml    bool // for DecodeYAML only; JSON goes to both
	want    *HcaConfig
	wantErr string // substring; "" means success
}

func decodeCases() []decodeCase {
	return slices.Concat(fieldCases(), documentCases(), malformedCases())
}

// fieldCases are about one field each: its values, its types, its YAML.
func fieldCases() []decodeCase {
	return []decodeCase{
		{
			name: "both fields",
			in:   `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","managementDevices":true,"env":false}`,
			want: &HcaConfig{TypeMeta: typeMeta, ManagementDevices: ptr(true), Env: ptr(false)},
		},
		{
			name: "moveNetdev",
			in:   `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","moveNetdev":true}`,
			want: &HcaConfig{TypeMeta: typeMeta, MoveNetdev: ptr(true)},
		},
		{
			name: "moveNetdev from YAML",
			yaml: true,
			in:   "apiVersion: rdma.dra.dev/v1alpha1\nkind: HcaConfig\nmoveNetdev: false\n",
			want: &HcaConfig{TypeMeta: typeMeta, MoveNetdev: ptr(false)},
		},
		{
			name:    "moveNetdev as a string",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","moveNetdev":"true"}`,
			wantErr: `moveNetdev: want a boolean, got "true"`,
		},
		{
			name:    "moveNetdev misspelt",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","moveNetDev":true}`,
			wantErr: `unknown field "moveNetDev" (known fields: apiVersion, kind, managementDevices, env, addressFamily, pkey, moveNetdev, memlock)`,
		},
		{
			name: "no fields",
			in:   `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig"}`,
			want: &HcaConfig{TypeMeta: typeMeta},
		},
		{
			name: "null leaves a field unset",
			in:   ` {"kind":"HcaConfig","env":null,"apiVersion":"rdma.dra.dev/v1alpha1"} ` + "\n",
			want: &HcaConfig{TypeMeta: typeMeta},
		},
		{
			name: "escaped key is the same key",
			in:   `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","\u0065nv":true}`,
			want: &HcaConfig{TypeMeta: typeMeta, Env: ptr(true)},
		},
		{
			name: "YAML",
			yaml: true,
			in:   "# from a file\napiVersion: rdma.dra.dev/v1alpha1\nkind: HcaConfig\nmanagementDevices: true\nenv: false\n",
			want: &HcaConfig{TypeMeta: typeMeta, ManagementDevices: ptr(true), Env: ptr(false)},
		},
		{
			name: "YAML with a leading document marker",
			yaml: true,
			in:   "---\napiVersion: rdma.dra.dev/v1alpha1\nkind: HcaConfig\nenv: yes\n---\n",
			want: &HcaConfig{TypeMeta: typeMeta, Env: ptr(true)},
		},
		{
			name: "addressFamily",
			in:   `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","addressFamily":"IPv6"}`,
			want: &HcaConfig{TypeMeta: typeMeta, AddressFamily: ptr(AddressFamilyIPv6)},
		},
		{
			name: "addressFamily in YAML, and null",
			yaml: true,
			in:   "apiVersion: rdma.dra.dev/v1alpha1\nkind: HcaConfig\naddressFamily: ~\n",
			want: &HcaConfig{TypeMeta: typeMeta},
		},
		{
			name:    "addressFamily is case-sensitive",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","addressFamily":"ipv6"}`,
			wantErr: `addressFamily: want one of "Auto", "IPv4", "IPv6", got "ipv6"`,
		},
		{
			name:    "addressFamily of the wrong type",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","addressFamily":6}`,
			wantErr: `addressFamily: want a string, got 6`,
		},
		{
			name: "pkey",
			in:   `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","pkey":"0x8001"}`,
			want: &HcaConfig{TypeMeta: typeMeta, PKey: ptr("0x8001")},
		},
		{
			name:    "pkey as a number (YAML would make 8001 one)",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","pkey":8001}`,
			wantErr: `pkey: want a string, got 8001`,
		},
		{
			name:    "pkey too long",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","pkey":"0x18001"}`,
			wantErr: `pkey: want a P_Key of 1 to 4 hex digits such as "0x8001", got "0x18001"`,
		},
		{
			name:    "pkey of no partition",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","pkey":"0x8000"}`,
			wantErr: `pkey: "0x8000" is not a partition`,
		},
	}
}

// documentCases are about the document as a whole: unknown, duplicate and
// misspelt fields, kind and apiVersion.
func documentCases() []decodeCase {
	return []decodeCase{
		{
			name:    "unknown field",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","managmentDevices":true}`,
			wantErr: `HcaConfig: unknown field "managmentDevices"`,
		},
		{
			name:    "field names are case-sensitive",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","Env":true}`,
			wantErr: `unknown field "Env"`,
		},
		{
			name:    "duplicate field",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","env":true,"env":false}`,
			wantErr: `HcaConfig: duplicate field "env"`,
		},
		{
			name:    "duplicate YAML key",
			yaml:    true,
			in:      "apiVersion: rdma.dra.dev/v1alpha1\nkind: HcaConfig\nenv: true\nenv: false\n",
			wantErr: `key "env" already set`,
		},
		{
			name:    "wrong kind",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"GpuConfig"}`,
			wantErr: `kind: want "HcaConfig", got "GpuConfig"`,
		},
		{
			name:    "kind checked before fields",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"GpuConfig","sharing":{}}`,
			wantErr: `kind: want "HcaConfig", got "GpuConfig"`,
		},
		{
			name:    "missing kind",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1"}`,
			wantErr: `kind: missing; want "HcaConfig"`,
		},
		{
			name:    "wrong apiVersion",
			in:      `{"apiVersion":"rdma.dra.dev/v1","kind":"HcaConfig"}`,
			wantErr: `apiVersion: want "rdma.dra.dev/v1alpha1", got "rdma.dra.dev/v1"`,
		},
		{
			name:    "apiVersion not a string",
			in:      `{"apiVersion":1,"kind":"HcaConfig"}`,
			wantErr: `apiVersion: want a string, got 1`,
		},
		{
			name:    "bad type",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","env":"yes"}`,
			wantErr: `env: want a boolean, got "yes"`,
		},
		{
			name:    "bad type, long value is cut",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","managementDevices":[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]}`,
			wantErr: `managementDevices: want a boolean, got [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,…`,
		},
	}
}

// malformedCases are documents that are not a config at all, or too big.
func malformedCases() []decodeCase {
	return []decodeCase{
		{
			name:    "empty object",
			in:      `{}`,
			wantErr: `apiVersion: missing; want "rdma.dra.dev/v1alpha1"`,
		},
		{
			name:    "empty input",
			in:      " \n",
			wantErr: "HcaConfig: no parameters",
		},
		{
			name:    "trailing data",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig"} {}`,
			wantErr: "HcaConfig: unexpected data after the object",
		},
		{
			name:    "trailing garbage",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig"}x`,
			wantErr: "HcaConfig: unexpected data after the object",
		},
		{
			name:    "truncated",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","env":tr`,
			wantErr: "HcaConfig: invalid JSON",
		},
		{
			name:    "unterminated object",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1"`,
			wantErr: "HcaConfig: invalid JSON: unexpected end of input",
		},
		{
			name:    "garbage JSON",
			in:      `{"apiVersion" "x"}`,
			wantErr: "HcaConfig: invalid JSON at byte",
		},
		{
			name:    "garbage",
			yaml:    true,
			in:      "\x00\xff not a config",
			wantErr: "HcaConfig: invalid YAML",
		},
		{
			name:    "array",
			in:      `[{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig"}]`,
			wantErr: "HcaConfig: want a JSON object, got an array",
		},
		{
			name:    "YAML scalar",
			yaml:    true,
			in:      "managementDevices",
			wantErr: "HcaConfig: want a JSON object, got a string",
		},
		{
			name:    "YAML comment only",
			yaml:    true,
			in:      "# nothing\n",
			wantErr: "HcaConfig: want a JSON object, got null",
		},
		{
			name:    "two YAML documents",
			yaml:    true,
			in:      "apiVersion: rdma.dra.dev/v1alpha1\nkind: HcaConfig\n---\napiVersion: rdma.dra.dev/v1alpha1\nkind: HcaConfig\nenv: false\n",
			wantErr: "HcaConfig: more than one YAML document",
		},
		{
			name:    "YAML bad type",
			yaml:    true,
			in:      "apiVersion: rdma.dra.dev/v1alpha1\nkind: HcaConfig\nenv: maybe\n",
			wantErr: `env: want a boolean, got "maybe"`,
		},
		{
			name:    "a field name in another case is unknown, apiVersion too",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","Kind":"Other"}`,
			wantErr: `HcaConfig: unknown field "Kind" (known fields: apiVersion, kind,`,
		},
		{
			name:    "every unknown and duplicate field, the known ones once",
			in:      `{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","foo":1,"env":true,"bar":{},"env":false}`,
			wantErr: `HcaConfig: unknown field "foo", unknown field "bar", duplicate field "env" (known fields: apiVersion, kind, managementDevices, env, addressFamily, pkey, moveNetdev, memlock)`,
		},
		{
			name:    "duplicate apiVersion",
			in:      `{"apiVersion":"rdma.dra.dev/v1","kind":"HcaConfig","apiVersion":"rdma.dra.dev/v1alpha1"}`,
			wantErr: `HcaConfig: duplicate field "apiVersion"`,
		},
		{
			name:    "apiVersion null",
			in:      `{"apiVersion":null,"kind":"HcaConfig"}`,
			wantErr: `apiVersion: want a string, got null`,
		},
		{
			name: "at the size bound",
			in:   minimal + strings.Repeat(" ", MaxParametersLength-len(minimal)),
			want: &HcaConfig{TypeMeta: typeMeta},
		},
		{
			name:    "over the size bound",
			in:      minimal + strings.Repeat(" ", MaxParametersLength-len(minimal)+1),
			wantErr: "HcaConfig: 10241 bytes; want at most 10240, the API server's bound for opaque parameters",
		},
		{
			name:    "YAML over the size bound",
			yaml:    true,
			in:      "apiVersion: rdma.dra.dev/v1alpha1\nkind: HcaConfig\n" + strings.Repeat("#", MaxParametersLength),
			wantErr: "want at most 10240",
		},
	}
}

func TestDecode(t *testing.T) {
	for _, tt := range decodeCases() {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeYAML([]byte(tt.in))
			checkDecoded(t, "DecodeYAML", tt.in, got, err, tt.want, tt.wantErr)
			if !tt.yaml {
				got, err := Decode([]byte(tt.in))
				checkDecoded(t, "Decode", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// checkDecoded fails t unless a decoder returned want, or an error
// containing wantErr and no config.
func checkDecoded(t *testing.T, decoder, input string, got *HcaConfig, err error, want *HcaConfig, wantErr string) {
	t.Helper()
	in := input
	if len(in) > 100 {
		in = in[:100] + "..."
	}
	if wantErr != "" {
		if err == nil {
			t.Errorf("%s(%q) = %s, want an error containing %q", decoder, in, show(got), wantErr)
		} else if !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s(%q) error = %q, want it to contain %q", decoder, in, err, wantErr)
		}
		if got != nil {
			t.Errorf("%s(%q) returned %s along with the error", decoder, in, show(got))
		}
		return
	}
	if err != nil {
		t.Errorf("%s(%q): %v", decoder, in, err)
	} else if !reflect.DeepEqual(got, want) {
		t.Errorf("%s(%q) = %s, want %s", decoder, in, show(got), show(want))
	}
}

// TestDecodeTakesJSONOnly: the API server hands parameters over as JSON;
// the driver's decoder does not guess at YAML.
func TestDecodeTakesJSONOnly(t *testing.T) {
	in := "apiVersion: rdma.dra.dev/v1alpha1\nkind: HcaConfig\nenv: false\n"
	if c, err := DecodeYAML([]byte(in)); err != nil || *c.Env {
		t.Fatalf("DecodeYAML(%q) = %s, %v; want env false", in, show(c), err)
	}
	c, err := Decode([]byte(in))
	if want := "HcaConfig: invalid JSON at byte 1: invalid character 'a' looking for beginning of value"; err == nil || err.Error() != want {
		t.Fatalf("Decode(%q) = %s, %v; want %q", in, show(c), err, want)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		c       *HcaConfig
		wantErr string
	}{
		{"defaults", DefaultHcaConfig(), ""},
		{"no fields", &HcaConfig{TypeMeta: typeMeta}, ""},
		{"nil", nil, "HcaConfig: no config"},
		{"no TypeMeta", &HcaConfig{Env: ptr(true)}, `apiVersion: missing; want "rdma.dra.dev/v1alpha1"`},
		{"wrong kind", &HcaConfig{TypeMeta: metav1.TypeMeta{APIVersion: APIVersion, Kind: "Hca"}}, `kind: want "HcaConfig", got "Hca"`},
		{"IPv6", &HcaConfig{TypeMeta: typeMeta, AddressFamily: ptr(AddressFamilyIPv6)}, ""},
		{"unknown family", &HcaConfig{TypeMeta: typeMeta, AddressFamily: ptr(AddressFamily("AF_INET6"))}, `addressFamily: want one of "Auto", "IPv4", "IPv6", got "AF_INET6"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Validate()
			if tt.wantErr == "" && err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr) {
				t.Fatalf("Validate() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	cfg := func(mgmt, env *bool) *HcaConfig {
		return &HcaConfig{TypeMeta: typeMeta, ManagementDevices: mgmt, Env: env}
	}
	tests := []struct {
		name      string
		chain     []*HcaConfig
		wantMgmt  bool
		wantEnv   bool
		wantInput []*HcaConfig // the chain after Merge: unchanged
	}{
		{name: "defaults", wantMgmt: false, wantEnv: true},
		{name: "nil config is skipped", chain: []*HcaConfig{nil}, wantMgmt: false, wantEnv: true},
		{name: "class config applies", chain: []*HcaConfig{cfg(ptr(true), nil)}, wantMgmt: true, wantEnv: true},
		{
			name:     "claim config after class config wins",
			chain:    []*HcaConfig{cfg(ptr(true), ptr(false)), cfg(ptr(false), ptr(true))},
			wantMgmt: false, wantEnv: true,
		},
		{
			name:     "nil field in the claim leaves the class value",
			chain:    []*HcaConfig{cfg(ptr(true), ptr(false)), cfg(nil, nil)},
			wantMgmt: true, wantEnv: false,
		},
		{
			name:     "each field from the last config that sets it",
			chain:    []*HcaConfig{cfg(ptr(true), nil), cfg(nil, ptr(false)), nil},
			wantMgmt: true, wantEnv: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := json.Marshal(tt.chain)
			got := Merge(tt.chain...)
			if err := got.Validate(); err != nil {
				t.Errorf("Merge result does not validate: %v", err)
			}
			if got.ManagementDevices == nil || got.Env == nil {
				t.Fatalf("Merge left a field unset: %s", show(got))
			}
			if *got.ManagementDevices != tt.wantMgmt || *got.Env != tt.wantEnv {
				t.Errorf("Merge = managementDevices %v env %v, want %v %v", *got.ManagementDevices, *got.Env, tt.wantMgmt, tt.wantEnv)
			}
			// The result must not alias an input.
			*got.ManagementDevices, *got.Env = !*got.ManagementDevices, !*got.Env
			if after, _ := json.Marshal(tt.chain); string(after) != string(before) {
				t.Errorf("changing the Merge result changed its input: %s, was %s", after, before)
			}
		})
	}
}

func TestMergeMoveNetdev(t *testing.T) {
	mv := func(b bool) *HcaConfig { return &HcaConfig{TypeMeta: typeMeta, MoveNetdev: &b} }
	tests := []struct {
		name  string
		chain []*HcaConfig
		want  bool
	}{
		{"default", nil, false},
		{"class asks", []*HcaConfig{mv(true), {TypeMeta: typeMeta}}, true},
		{"claim overrides class", []*HcaConfig{mv(true), mv(false)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Merge(tt.chain...)
			if got.MoveNetdev == nil || *got.MoveNetdev != tt.want {
				t.Fatalf("Merge = %s, want moveNetdev %v", show(got), tt.want)
			}
			*got.MoveNetdev = !*got.MoveNetdev
			if len(tt.chain) > 0 && *tt.chain[0].MoveNetdev != (tt.name != "default") {
				t.Error("changing the Merge result changed its input")
			}
		})
	}
}

func TestMergeAddressFamily(t *testing.T) {
	fam := func(f AddressFamily) *HcaConfig { return &HcaConfig{TypeMeta: typeMeta, AddressFamily: &f} }
	tests := []struct {
		name  string
		chain []*HcaConfig
		want  AddressFamily
	}{
		{"default", nil, AddressFamilyAuto},
		{"class sets IPv6", []*HcaConfig{fam(AddressFamilyIPv6), {TypeMeta: typeMeta}}, AddressFamilyIPv6},
		{"claim overrides class", []*HcaConfig{fam(AddressFamilyIPv6), fam(AddressFamilyIPv4)}, AddressFamilyIPv4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Merge(tt.chain...)
			if got.AddressFamily == nil || *got.AddressFamily != tt.want {
				t.Fatalf("Merge = %s, want addressFamily %s", show(got), tt.want)
			}
			*got.AddressFamily = "changed"
			for _, c := range tt.chain {
				if c.AddressFamily != nil && *c.AddressFamily == "changed" {
					t.Fatal("the Merge result aliases an input")
				}
			}
		})
	}
}

func TestDefaultHcaConfigIsFresh(t *testing.T) {
	a := DefaultHcaConfig()
	*a.Env = false
	if b := DefaultHcaConfig(); !*b.Env {
		t.Fatal("changing one DefaultHcaConfig result changed the next")
	}
}

func show(c *HcaConfig) string {
	b, _ := json.Marshal(c)
	return string(b)
}

// BenchmarkDecode decodes a claim's config as prepare does, once per
// opaque config.
func BenchmarkDecode(b *testing.B) {
	raw := []byte(`{"apiVersion":"rdma.dra.dev/v1alpha1","kind":"HcaConfig","managementDevices":true,"env":false,"addressFamily":"IPv6","pkey":"0x8001"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(raw); err != nil {
			b.Fatal(err)
		}
	}
}
