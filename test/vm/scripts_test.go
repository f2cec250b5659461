package vm

import (
	"embed"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// The shell the guests and their containers run, each file with its
// inputs as arguments or environment (its header says which).
//
//go:embed testdata/*.sh
var scripts embed.FS

// scriptText is testdata/name's text.
func scriptText(name string) string {
	b, err := scripts.ReadFile(path.Join("testdata", name))
	if err != nil {
		panic(err) // a name below that is not embedded: a bug of this package
	}
	return string(b)
}

// TestScriptsParse checks the syntax of every testdata/*.sh of the test
// module with sh -n and bash -n, without QEMU or root.
func TestScriptsParse(t *testing.T) {
	var files []string
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Base(filepath.Dir(p)) == "testdata" && strings.HasSuffix(p, ".sh") {
			files = append(files, p)
		}
		return err
	})
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/*.sh under the test module (%v)", err)
	}
	for _, f := range files {
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

// guestScripts is where a guest or a pod finds the scripts it runs.
const guestScripts = "/scripts"

// scriptFiles writes testdata's files of the given names into dir for an
// image's guestScripts.
func scriptFiles(dir string, names ...string) ([]GuestFile, error) {
	var files []GuestFile
	for _, n := range names {
		src := filepath.Join(dir, n)
		if err := os.WriteFile(src, []byte(scriptText(n)), 0o644); err != nil {
			return nil, err
		}
		files = append(files, GuestFile{Path: guestScripts + "/" + n, Src: src})
	}
	return files, nil
}

// shCommand is a container's command running testdata/name with args.
func shCommand(name string, args ...string) []string {
	return append([]string{"sh", "-c", scriptText(name), name}, args...)
}
