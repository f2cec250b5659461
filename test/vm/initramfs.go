package vm

// Assembling the guest's initramfs: kernel modules in dependency order (read
// from each .ko's .modinfo, since the .deb ships no modules.dep), userspace
// binaries with the shared libraries their ELF headers name, and /init.

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Modules indexes a kernel's modules by name (dashes as underscores).
type Modules struct {
	Release string
	byName  map[string]string // name -> .ko path
}

// LoadModules walks root/lib/modules/<release>/kernel.
func LoadModules(root, release string) (*Modules, error) {
	dir := filepath.Join(root, "lib", "modules", release, "kernel")
	m := &Modules{Release: release, byName: map[string]string{}}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			m.byName[modName(filepath.Base(p))] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kernel modules of %s: %w", release, err)
	}
	if len(m.byName) == 0 {
		return nil, fmt.Errorf("kernel modules of %s: no .ko under %s (compressed modules are not supported)", release, dir)
	}
	return m, nil
}

// Add registers a module built outside the package (siw).
func (m *Modules) Add(path string) { m.byName[modName(filepath.Base(path))] = path }

func modName(file string) string {
	return strings.ReplaceAll(strings.TrimSuffix(file, ".ko"), "-", "_")
}

// modinfoDepends reads the depends= field of a module's .modinfo section.
func modinfoDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", path, err)
	}
	defer f.Close()
	s := f.Section(".modinfo")
	if s == nil {
		return nil, fmt.Errorf("module %s: no .modinfo section", path)
	}
	b, err := s.Data()
	if err != nil {
		return nil, fmt.Errorf("module %s: .modinfo: %w", path, err)
	}
	var deps []string
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok && len(v) > 0 {
			for _, d := range strings.Split(string(v), ",") {
				deps = append(deps, modName(d))
			}
		}
	}
	return deps, nil
}

// Order returns the .ko paths to insmod for roots, dependencies first.
func (m *Modules) Order(roots ...string) ([]string, error) {
	var out []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name, from string) error
	visit = func(name, from string) error {
		switch state[name] {
		case 1:
			return fmt.Errorf("module dependency cycle at %s", name)
		case 2:
			return nil
		}
		p, ok := m.byName[name]
		if !ok {
			if from == "" {
				return fmt.Errorf("module %s is not in kernel %s", name, m.Release)
			}
			return fmt.Errorf("module %s (needed by %s) is not in kernel %s", name, from, m.Release)
		}
		state[name] = 1
		deps, err := modinfoDepends(p)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		out = append(out, p)
		return nil
	}
	for _, r := range roots {
		if err := visit(modName(r), ""); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Libraries resolves the shared libraries of ELF files from a set of
// unpacked package roots (never from the host).
type Libraries struct {
	Roots []string
	dirs  []string // lib dirs relative to a root
}

// NewLibraries searches the usual Debian multiarch lib dirs of roots.
func NewLibraries(roots ...string) *Libraries {
	return &Libraries{Roots: roots, dirs: []string{
		"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "lib", "usr/lib",
	}}
}

// find returns the guest path and host file of a library by soname.
func (l *Libraries) find(soname string) (guest, host string, ok bool) {
	for _, r := range l.Roots {
		for _, d := range l.dirs {
			p := filepath.Join(r, d, soname)
			if _, err := os.Stat(p); err == nil {
				return "/" + d + "/" + soname, p, true
			}
		}
	}
	return "", "", false
}

// AddELF puts the host file src at guest path dst and every library it
// needs, transitively, at their usual paths. Symlinked libraries are
// copied as files under their soname.
func (l *Libraries) AddELF(t *Tree, dst, src string) error {
	t.Copy(dst, src, 0o755)
	return l.addNeeded(t, dst, src)
}

func (l *Libraries) addNeeded(t *Tree, dst, src string) error {
	f, err := elf.Open(src)
	if err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	defer f.Close()
	needed, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: reading DT_NEEDED: %w", dst, err)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return fmt.Errorf("%s: reading its interpreter: %w", dst, err)
		}
		interp := strings.TrimRight(string(b), "\x00")
		if !t.Has(interp) {
			_, host, ok := l.find(filepath.Base(interp))
			if !ok {
				return fmt.Errorf("%s: interpreter %s is in none of the packages %v", dst, interp, l.Roots)
			}
			t.Copy(interp, host, 0o755)
		}
	}
	for _, so := range needed {
		guest, host, ok := l.find(so)
		if !ok {
			return fmt.Errorf("%s needs %s, which is in none of the unpacked packages; add its package to the VM's library packages", dst, so)
		}
		if t.Has(guest) {
			continue
		}
		t.Copy(guest, host, 0o755)
		if err := l.addNeeded(t, guest, host); err != nil {
			return err
		}
	}
	return nil
}

// AddDir copies a directory of an unpacked package (regular files and
// symlinks), resolving ELF libraries for the .so files in it.
func (l *Libraries) AddDir(t *Tree, root, rel string) error {
	base := filepath.Join(root, rel)
	var names []string
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("package directory %s: %w", rel, err)
	}
	sort.Strings(names)
	for _, p := range names {
		guest := "/" + filepath.ToSlash(strings.TrimPrefix(p, root+"/"))
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			t.Symlink(guest, target)
			// The target must be there too.
			tp := target
			if !filepath.IsAbs(tp) {
				tp = filepath.Join(filepath.Dir(p), target)
			} else {
				tp = filepath.Join(root, target)
			}
			tguest := "/" + strings.TrimPrefix(filepath.Clean(tp), root+"/")
			if !t.Has(tguest) {
				if _, err := os.Stat(tp); err != nil {
					return fmt.Errorf("%s -> %s: %w", guest, target, err)
				}
				if err := l.AddELF(t, tguest, tp); err != nil {
					return err
				}
			}
			continue
		}
		if strings.Contains(filepath.Base(p), ".so") {
			if err := l.AddELF(t, guest, p); err != nil {
				return err
			}
			continue
		}
		t.Copy(guest, p, fi.Mode().Perm())
	}
	return nil
}
