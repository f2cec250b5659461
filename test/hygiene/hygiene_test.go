// Package hygiene holds the repository's rules for its own tests, checked
// statically: no test function over maxTestLines lines, no hand-written
// deadline loop in the test module (test/poll waits), and shell in
// testdata/*.sh files that sh and bash parse.
package hygiene

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxTestLines bounds a Test, Benchmark or Fuzz function, braces included;
// a longer one is split into named steps or subtests.
const maxTestLines = 150

// goFiles are the .go files under root whose names end in suffix.
func goFiles(t *testing.T, root, suffix string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "vendor" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, suffix) {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestNoLongTestFunctions(t *testing.T) {
	fset := token.NewFileSet()
	files := goFiles(t, "../..", "_test.go")
	for _, p := range files {
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !regexp.MustCompile(`^(Test|Benchmark|Fuzz)`).MatchString(fn.Name.Name) {
				continue
			}
			start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
			if n := end.Line - start.Line + 1; n > maxTestLines {
				t.Errorf("%s:%d: %s is %d lines, over %d: split it into named steps or subtests", p, start.Line, fn.Name.Name, n, maxTestLines)
			}
		}
	}
	t.Logf("%d test files checked", len(files))
}

// A wait is poll.Until or poll.For; a loop against a deadline of its own
// is not.
var deadlineLoop = regexp.MustCompile(`time\.Now\(\)\.Before\(|\bdeadline :=`)

func TestNoDeadlineLoops(t *testing.T) {
	for _, p := range goFiles(t, "..", ".go") {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(b), "\n") {
			if deadlineLoop.MatchString(l) && !strings.HasPrefix(strings.TrimSpace(l), "//") && !strings.HasSuffix(p, "hygiene_test.go") {
				t.Errorf("%s:%d: a hand-written deadline loop; wait with test/poll: %s", p, i+1, strings.TrimSpace(l))
			}
		}
	}
}

// TestScriptsParse checks the syntax of every testdata/*.sh of the test
// module with sh -n and bash -n.
func TestScriptsParse(t *testing.T) {
	scripts, err := filepath.Glob("../*/testdata/*.sh")
	if err != nil {
		t.Fatal(err)
	}
	more, err := filepath.Glob("../*/*/testdata/*.sh")
	if err != nil {
		t.Fatal(err)
	}
	scripts = append(scripts, more...)
	if len(scripts) == 0 {
		t.Fatal("no testdata/*.sh under the test module")
	}
	for _, f := range scripts {
		for _, sh := range []string{"sh", "bash"} {
			t.Run(sh+"/"+strings.TrimPrefix(f, "../"), func(t *testing.T) {
				if _, err := exec.LookPath(sh); err != nil {
					t.Skipf("no %s on this machine: %v", sh, err)
				}
				if out, err := exec.Command(sh, "-n", f).CombinedOutput(); err != nil {
					t.Errorf("%s -n %s: %v\n%s", sh, f, err, out)
				}
			})
		}
	}
}
