package guest

import (
	"embed"
	"path"
)

// The shell the guest's containers run, each file with its inputs as
// arguments (its header says which); hygiene's TestScriptsParse checks them.
//
//go:embed testdata/*.sh
var scripts embed.FS

// shScript is the command line that runs testdata/name with args.
func shScript(name string, args ...string) []string {
	b, err := scripts.ReadFile(path.Join("testdata", name))
	if err != nil {
		panic(err) // a name that is not embedded: a bug of this package
	}
	return append([]string{"sh", "-c", string(b), name}, args...)
}
