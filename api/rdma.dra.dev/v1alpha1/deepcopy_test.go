package v1alpha1

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestFieldsAreOptionalPointers: Merge and Decode find the fields by
// reflection and rely on this shape (nil means "not set").
func TestFieldsAreOptionalPointers(t *testing.T) {
	typ := reflect.TypeFor[HcaConfig]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Anonymous {
			continue // TypeMeta
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Type.Kind() != reflect.Pointer || name == "" || opts != "omitempty" {
			t.Errorf("field %s (%s, json %q): want a pointer with a json name and omitempty", f.Name, f.Type, f.Tag.Get("json"))
		}
	}
}

// everyFieldSet returns a config with every field set to a value other
// than its default, found by reflection so that a field added later is
// covered.
func everyFieldSet(t *testing.T) *HcaConfig {
	t.Helper()
	c := &HcaConfig{TypeMeta: typeMeta}
	v, def := reflect.ValueOf(c).Elem(), reflect.ValueOf(DefaultHcaConfig()).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if v.Type().Field(i).Anonymous {
			continue
		}
		p := reflect.New(f.Type().Elem())
		switch p.Elem().Kind() {
		case reflect.Bool:
			p.Elem().SetBool(def.Field(i).IsNil() || !def.Field(i).Elem().Bool())
		case reflect.String:
			p.Elem().SetString("not the default")
		case reflect.Int64:
			p.Elem().SetInt(42) // no int64 field has a default
		default:
			t.Fatalf("field %s: everyFieldSet does not know kind %s", v.Type().Field(i).Name, p.Elem().Kind())
		}
		f.Set(p)
	}
	return c
}

// sharedPointers names the pointer fields of a and b that point to the
// same memory.
func sharedPointers(a, b *HcaConfig) []string {
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	var out []string
	for i := range va.NumField() {
		fa, fb := va.Field(i), vb.Field(i)
		if fa.Kind() == reflect.Pointer && !fa.IsNil() && fa.Pointer() == fb.Pointer() {
			out = append(out, va.Type().Field(i).Name)
		}
	}
	return out
}

// TestDeepCopy checks the generated copy on every field: equal, and no
// pointer shared. A generated file older than a new pointer field fails
// here even where deepcopy-gen cannot run.
func TestDeepCopy(t *testing.T) {
	c := everyFieldSet(t)
	got, ok := c.DeepCopyObject().(*HcaConfig)
	if !ok {
		t.Fatalf("DeepCopyObject returned %T", c.DeepCopyObject())
	}
	if !reflect.DeepEqual(got, c) {
		t.Errorf("DeepCopy = %s, want %s", show(got), show(c))
	}
	if shared := sharedPointers(got, c); len(shared) > 0 {
		t.Errorf("DeepCopy shares %s with its original", shared)
	}
	if (*HcaConfig)(nil).DeepCopy() != nil {
		t.Error("DeepCopy of nil is not nil")
	}
}

// TestMergeTakesEveryField: a field set in the last config wins, copied.
func TestMergeTakesEveryField(t *testing.T) {
	c := everyFieldSet(t)
	got := Merge(DefaultHcaConfig(), c)
	if !reflect.DeepEqual(got, c) {
		t.Errorf("Merge = %s, want %s", show(got), show(c))
	}
	if shared := sharedPointers(got, c); len(shared) > 0 {
		t.Errorf("Merge result shares %s with its input", shared)
	}
}

// TestGeneratedDeepCopyIsCurrent runs this package's go:generate line
// (deepcopy-gen, a tool of go.mod) on a copy of the package and compares
// what it writes with zz_generated.deepcopy.go. It never downloads: the
// tool's modules must be in the module cache, as they are wherever
// `make generate` or `go mod download` ran.
func TestGeneratedDeepCopyIsCurrent(t *testing.T) {
	t.Parallel()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to run deepcopy-gen with")
	}
	env := append(os.Environ(), "GOPROXY=off", "GOWORK=off", "GOFLAGS="+os.Getenv("GOFLAGS")+" -mod=readonly")
	run := func(dir string, args ...string) (string, error) {
		cmd := exec.Command(goCmd, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	pkgDir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run(pkgDir, "list", "k8s.io/code-generator/cmd/deepcopy-gen"); err != nil {
		t.Skipf("deepcopy-gen's modules are not in the module cache and this test does not download (go mod download fetches them): %s", lastLine(out))
	}
	gomod, err := run(pkgDir, "env", "GOMOD")
	if err != nil {
		t.Fatalf("go env GOMOD: %v: %s", err, gomod)
	}
	root := filepath.Dir(gomod)
	// The copy: go.mod, go.sum and the sources of this package and of the
	// module's packages it imports, which the generator type-checks.
	dirs, err := run(pkgDir, "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", ".")
	if err != nil {
		t.Fatalf("go list -deps: %v: %s", err, dirs)
	}
	tmp := t.TempDir()
	copyFiles(t, root, tmp, "go.mod", "go.sum")
	for _, dir := range strings.Fields(dirs) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		sources, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, src := range sources {
			if !strings.HasSuffix(src, "_test.go") {
				copyFiles(t, dir, filepath.Join(tmp, rel), filepath.Base(src))
			}
		}
	}
	const generated = "zz_generated.deepcopy.go"
	rel, _ := filepath.Rel(root, pkgDir)
	copyDir := filepath.Join(tmp, rel)
	if err := os.Remove(filepath.Join(copyDir, generated)); err != nil {
		t.Fatal(err)
	}
	if out, err := run(copyDir, "generate", "."); err != nil {
		t.Fatalf("go generate: %v\n%s", err, out)
	}
	want, err := os.ReadFile(filepath.Join(copyDir, generated))
	if err != nil {
		t.Fatalf("go generate wrote no %s: %v", generated, err)
	}
	got, err := os.ReadFile(generated)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale (run make generate); the first difference is at line %d:\n have %q\n want %q",
			generated, firstDifference(got, want)+1, line(got, firstDifference(got, want)), line(want, firstDifference(got, want)))
	}
}

func copyFiles(t *testing.T, from, to string, names ...string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(from, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// firstDifference returns the index of the first line where a and b differ.
func firstDifference(a, b []byte) int {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	i := 0
	for i < len(la) && i < len(lb) && la[i] == lb[i] {
		i++
	}
	return i
}

func line(b []byte, i int) string {
	lines := strings.Split(string(b), "\n")
	if i >= len(lines) {
		return "(end of file)"
	}
	return lines[i]
}

func lastLine(s string) string {
	return s[strings.LastIndex(s, "\n")+1:]
}
