package vm

import (
	"embed"
	"os"
	"path"
	"path/filepath"
)

// The shell the guests and their containers run, each file with its
// inputs as arguments or environment (its header says which); hygiene's
// TestScriptsParse checks their syntax.
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
