//go:build !linux

package hca

import (
	"os"
	"path/filepath"
)

// Elsewhere than Linux every file is read by its path.

func (p *pass) openDir(parent dir, name string) dir { return dir{fd: -1, path: parent.join(name)} }
func (p *pass) openDirErr(parent dir, name string) (dir, error) {
	return p.openDir(parent, name), nil
}
func (p *pass) rootDir(path string) dir { return dir{fd: -1, path: path} }
func (p *pass) closeDir(dir)            {}

func (p *pass) readIn(d dir, name string) ([]byte, error)  { return p.d.readFile(d.join(name)) }
func (p *pass) names(d dir, name string) ([]string, error) { return dirNames(d.join(name)) }

func (p *pass) isDirIn(d dir, name string) bool {
	fi, err := os.Stat(d.join(name))
	return err == nil && fi.IsDir()
}

func (p *pass) readlinkIn(d dir, name string) (string, error) { return os.Readlink(d.join(name)) }
func (p *pass) realPath(d dir) (string, error)                { return filepath.EvalSymlinks(d.path) }

type portWatch struct{}

func newPortWatch() *portWatch { return nil }
func (w *portWatch) close()    {}

func (d *Discoverer) portStates() (map[string]string, bool, error) { return nil, false, nil }

// identity: no inode numbers here; a replaced device is seen by the next
// full pass.
func (p *pass) identity(d dir, name string) (devIdent, bool) {
	_, err := os.Stat(d.join(name))
	return devIdent{}, err == nil
}
