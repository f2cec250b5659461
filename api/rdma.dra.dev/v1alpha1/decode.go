package v1alpha1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// knownFields lists the fields of HcaConfig for the unknown-field error.
const knownFields = "apiVersion, kind, managementDevices, env, addressFamily, pkey, moveNetdev"

// Decode parses opaque parameters into an HcaConfig, strictly: unknown and
// duplicate fields, a missing or wrong apiVersion or kind, a value of the
// wrong type and data after the object are errors naming what was found.
// Field names are case-sensitive, as everywhere in the Kubernetes API.
//
// The API server hands parameters over as JSON. Input that does not start
// with '{' is read as YAML, converted as kubectl converts manifests (so
// "env: yes" is true, as it would be after kubectl apply), for tools and
// tests that keep configs in files.
//
// The result has passed Validate. Fields the input omits stay nil; Merge
// applies the defaults.
func Decode(raw []byte) (*HcaConfig, error) {
	trimmed := bytes.TrimLeft(raw, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, fmt.Errorf("HcaConfig: no parameters; want an object with apiVersion %q and kind %q", APIVersion, Kind)
	}
	if trimmed[0] != '{' {
		j, err := yamlToJSON(raw)
		if err != nil {
			return nil, err
		}
		raw = j
	}
	return decodeJSON(raw)
}

// yamlToJSON converts one YAML document to JSON, rejecting duplicate keys
// and further documents (the converter would silently drop them).
func yamlToJSON(y []byte) (j []byte, err error) {
	if extraYAMLDocument(y) {
		return nil, errors.New("HcaConfig: more than one YAML document; want exactly one HcaConfig")
	}
	// The parser is third-party code at a trust boundary: a panic in it
	// must fail the claim, not crash the driver.
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

func decodeJSON(raw []byte) (*HcaConfig, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, jsonError(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("HcaConfig: want a JSON object, got %s", describe(tok))
	}

	// Keys in input order, so the first bad field is the one reported.
	var keys []string
	values := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, jsonError(err)
		}
		key, _ := tok.(string) // the decoder only yields strings here
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, jsonError(err)
		}
		if _, dup := values[key]; dup {
			return nil, fmt.Errorf("HcaConfig: duplicate field %q", key)
		}
		keys = append(keys, key)
		values[key] = v
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("HcaConfig: unexpected data after the object")
	}

	// The type first: with a wrong kind or version, the fields of some
	// other object would only produce confusing unknown-field errors.
	c := &HcaConfig{}
	if v, ok := values["apiVersion"]; ok {
		if c.APIVersion, err = stringField("apiVersion", v); err != nil {
			return nil, err
		}
	}
	if v, ok := values["kind"]; ok {
		if c.Kind, err = stringField("kind", v); err != nil {
			return nil, err
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	for _, key := range keys {
		v := values[key]
		switch key {
		case "apiVersion", "kind":
		case "managementDevices":
			c.ManagementDevices, err = boolField(key, v)
		case "env":
			c.Env, err = boolField(key, v)
		case "addressFamily":
			c.AddressFamily, err = familyField(key, v)
		case "pkey":
			c.PKey, err = pkeyField(v)
		case "moveNetdev":
			c.MoveNetdev, err = boolField(key, v)
		default:
			err = fmt.Errorf("HcaConfig: unknown field %q (known fields: %s)", key, knownFields)
		}
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}

func stringField(name string, v json.RawMessage) (string, error) {
	var s string
	if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
		return "", fmt.Errorf("%s: want a string, got %s", name, shorten(v))
	}
	return s, nil
}

// boolField decodes an optional boolean; null means unset, as in the
// Kubernetes API.
func boolField(name string, v json.RawMessage) (*bool, error) {
	switch string(v) {
	case "true":
		return ptr(true), nil
	case "false":
		return ptr(false), nil
	case "null":
		return nil, nil
	}
	return nil, fmt.Errorf("%s: want a boolean, got %s", name, shorten(v))
}

// familyField decodes an optional AddressFamily; null means unset.
func familyField(name string, v json.RawMessage) (*AddressFamily, error) {
	if string(v) == "null" {
		return nil, nil
	}
	s, err := stringField(name, v)
	if err != nil {
		return nil, err
	}
	f := AddressFamily(s)
	if !slices.Contains(addressFamilies, f) {
		return nil, fmt.Errorf("%s: want one of %s, got %s", name, listFamilies(), shorten(v))
	}
	return &f, nil
}

// pkeyField decodes an optional P_Key string; null means unset.
func pkeyField(v json.RawMessage) (*string, error) {
	if string(v) == "null" {
		return nil, nil
	}
	s, err := stringField("pkey", v)
	if err != nil {
		return nil, err
	}
	if _, err := ParsePKey(s); err != nil {
		return nil, err
	}
	return &s, nil
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

// describe names the JSON value a token starts.
func describe(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	default:
		return "a number"
	}
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
