package v1alpha1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// MaxParametersLength is the largest config Decode reads: the API server's
// own bound on opaque parameters (resource.k8s.io's
// OpaqueParametersMaxLength), so no config that got into a claim is refused
// for its size.
const MaxParametersLength = 10 * 1024

var (
	scheme = newScheme()
	// strictJSON refuses unknown and duplicate fields, matches field names
	// case-sensitively and creates only the kinds the scheme knows.
	strictJSON = kjson.NewSerializerWithOptions(caseSensitiveMeta{}, scheme, scheme, kjson.SerializerOptions{Strict: true})
	// configFields are the fields of HcaConfig after TypeMeta, by reflection:
	// adding a field to the type is all decoding needs.
	configFields = jsonFields(reflect.TypeFor[HcaConfig]())
	// knownFields lists them for the unknown-field error.
	knownFields = strings.Join(append([]string{"apiVersion", "kind"}, fieldNames(configFields)...), ", ")
)

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		panic(err) // registering fixed types in a new scheme cannot fail
	}
	return s
}

// caseSensitiveMeta finds an object's apiVersion and kind as the strict
// serializer reads every field, case-sensitively. The default MetaFactory
// would take a "Kind" field for the kind and report an unregistered kind
// where the field is unknown.
type caseSensitiveMeta struct{}

func (caseSensitiveMeta) Interpret(data []byte) (*schema.GroupVersionKind, error) {
	var tm metav1.TypeMeta
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &tm); err != nil {
		return nil, err
	}
	gv, err := schema.ParseGroupVersion(tm.APIVersion)
	if err != nil {
		return nil, err
	}
	gvk := gv.WithKind(tm.Kind)
	return &gvk, nil
}

// Decode parses opaque parameters, JSON as the API server hands them over,
// into an HcaConfig, strictly: unknown and duplicate fields, a missing or
// wrong apiVersion or kind, a value of the wrong type, a value the field
// does not allow and data after the object are errors naming what was
// found. Field names are case-sensitive, as everywhere in the Kubernetes
// API. The decoding is the scheme's strict serializer's; this function
// only words its errors.
//
// The result has passed Validate. Fields the input omits stay nil; Merge
// applies the defaults.
func Decode(raw []byte) (*HcaConfig, error) {
	fields, err := topLevelFields(raw)
	if err != nil {
		return nil, err
	}
	// The type first: with a wrong kind or version, the fields of some
	// other object would only produce confusing unknown-field errors.
	for _, f := range []struct{ name, want string }{{"apiVersion", APIVersion}, {"kind", Kind}} {
		var got string
		if v, ok := fields[f.name]; ok && (v[0] != '"' || json.Unmarshal(v, &got) != nil) {
			return nil, fmt.Errorf("%s: want a string, got %s", f.name, shorten(v))
		}
		if err := checkTypeMeta(f.name, got, f.want); err != nil {
			return nil, err
		}
	}
	c := &HcaConfig{}
	if _, _, err := strictJSON.Decode(raw, nil, c); err != nil {
		return nil, decodeError(err, fields)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// DecodeYAML is Decode for a config a person wrote in a file: one YAML
// document, converted as kubectl converts manifests, so "env: yes" is true
// as it would be after kubectl apply. Duplicate keys and a second document
// are errors; the converter would drop them silently. Input that starts
// with '{' is JSON, for Decode (YAML's parser ignores what follows a flow
// mapping).
func DecodeYAML(raw []byte) (*HcaConfig, error) {
	if err := checkSize(raw); err != nil {
		return nil, err
	}
	if bytes.TrimSpace(raw)[0] == '{' {
		return Decode(raw)
	}
	j, err := yamlToJSON(raw)
	if err != nil {
		return nil, err
	}
	return Decode(j)
}

func checkSize(raw []byte) error {
	if len(raw) > MaxParametersLength {
		return fmt.Errorf("HcaConfig: %d bytes; want at most %d, the API server's bound for opaque parameters", len(raw), MaxParametersLength)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return fmt.Errorf("HcaConfig: no parameters; want an object with apiVersion %q and kind %q", APIVersion, Kind)
	}
	return nil
}

// topLevelFields checks that raw is one JSON object and returns its
// fields, raw, for the type check and for quoting a value of the wrong
// type.
func topLevelFields(raw []byte) (map[string]json.RawMessage, error) {
	if err := checkSize(raw); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	var fields map[string]json.RawMessage
	if err := dec.Decode(&fields); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) {
			return nil, fmt.Errorf("HcaConfig: want a JSON object, got %s", article(typ.Value))
		}
		return nil, jsonError(err)
	}
	if fields == nil {
		return nil, errors.New("HcaConfig: want a JSON object, got null")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("HcaConfig: unexpected data after the object")
	}
	return fields, nil
}

// decodeError words an error of the strict serializer: an unknown or
// duplicate field as such, a value of the wrong type with the field, the
// type it wants and the value found.
func decodeError(err error, fields map[string]json.RawMessage) error {
	if strict, ok := runtime.AsStrictDecodingError(err); ok {
		msgs := make([]string, 0, len(strict.Errors()))
		unknown := false
		for _, e := range strict.Errors() {
			msgs = append(msgs, e.Error())
			unknown = unknown || strings.HasPrefix(e.Error(), "unknown field ")
		}
		msg := "HcaConfig: " + strings.Join(msgs, ", ")
		if unknown {
			msg += " (known fields: " + knownFields + ")"
		}
		return errors.New(msg)
	}
	// The serializer's type error names the Go type; find the field by
	// decoding each value on its own into its field's type.
	for _, f := range configFields {
		v, ok := fields[f.name]
		if ok && json.Unmarshal(v, reflect.New(f.typ).Interface()) != nil {
			return fmt.Errorf("%s: want %s, got %s", f.name, describeType(f.typ), shorten(v))
		}
	}
	return fmt.Errorf("HcaConfig: %w", err)
}

// configField is a field of HcaConfig: its JSON name and Go type.
type configField struct {
	name string
	typ  reflect.Type
}

// jsonFields returns the fields of a struct in declaration order, leaving
// out inlined structs (TypeMeta, which Decode checks first).
func jsonFields(t reflect.Type) []configField {
	var out []configField
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" && f.IsExported() {
			out = append(out, configField{name, f.Type})
		}
	}
	return out
}

func fieldNames(fields []configField) []string {
	out := make([]string, len(fields))
	for i, f := range fields {
		out[i] = f.name
	}
	return out
}

// describeType names the JSON value a field of type t takes.
func describeType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	default:
		return "a number"
	}
}

// article puts "a" or "an" before encoding/json's name of a JSON value.
func article(value string) string {
	switch value {
	case "array":
		return "an array"
	case "bool":
		return "a boolean"
	default:
		return "a " + value
	}
}

func jsonError(err error) error {
	var syn *json.SyntaxError
	switch {
	case errors.As(err, &syn):
		return fmt.Errorf("HcaConfig: invalid JSON at byte %d: %s", syn.Offset, strings.TrimPrefix(syn.Error(), "json: "))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("HcaConfig: invalid JSON: unexpected end of input")
	}
	return fmt.Errorf("HcaConfig: invalid JSON: %w", err)
}

// shorten renders a JSON value for an error message: compact, and cut to
// a length that keeps the message readable.
func shorten(v json.RawMessage) string {
	const max = 40
	var b bytes.Buffer
	s := string(v)
	if json.Compact(&b, v) == nil {
		s = b.String()
	}
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// yamlToJSON converts one YAML document to JSON, rejecting duplicate keys
// and further documents (the converter would silently drop them).
func yamlToJSON(y []byte) (j []byte, err error) {
	if extraYAMLDocument(y) {
		return nil, errors.New("HcaConfig: more than one YAML document; want exactly one HcaConfig")
	}
	// The parser is third-party code reading what a person wrote: a panic
	// in it must be an error, not a crash.
	defer func() {
		if r := recover(); r != nil {
			j, err = nil, fmt.Errorf("HcaConfig: invalid YAML (the parser failed: %v)", r)
		}
	}()
	j, err = yaml.YAMLToJSONStrict(y)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
		return nil, fmt.Errorf("HcaConfig: invalid YAML: %s", strings.Join(strings.Fields(msg), " "))
	}
	return j, nil
}

// extraYAMLDocument reports whether y holds content after a document
// marker ("---" or "...") that followed content. The markers are only
// markers at the start of a line, where YAML forbids them inside scalars,
// so a line scan is exact enough.
func extraYAMLDocument(y []byte) bool {
	content, ended := false, false
	for line := range bytes.Lines(y) {
		line = bytes.TrimRight(line, " \t\r\n")
		if rest, ok := cutMarker(line); ok {
			if content {
				ended = true
			}
			line = rest
		}
		t := bytes.TrimLeft(line, " \t")
		if len(t) == 0 || t[0] == '#' || (!content && t[0] == '%') {
			continue
		}
		if ended {
			return true
		}
		content = true
	}
	return false
}

func cutMarker(line []byte) ([]byte, bool) {
	for _, m := range []string{"---", "..."} {
		if rest, ok := bytes.CutPrefix(line, []byte(m)); ok && (len(rest) == 0 || rest[0] == ' ' || rest[0] == '\t') {
			return rest, true
		}
	}
	return line, false
}
