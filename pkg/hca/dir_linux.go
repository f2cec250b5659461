//go:build linux

package hca

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// On Linux a pass opens each directory it reads (an ibdev, a port, a PCI
// function) once and reads its files with openat: the kernel walks one or
// two path components per file instead of the whole path and the class
// symlink.

// openDir opens name under parent. On failure the dir has no fd and is
// read by path, so errors name the files as before.
func (p *pass) openDir(parent dir, name string) dir {
	d, _ := p.openDirErr(parent, name)
	return d
}

// openDirErr is openDir with the reason it has no fd (nil when the parent
// had none either).
func (p *pass) openDirErr(parent dir, name string) (dir, error) {
	d := dir{fd: -1, path: parent.join(name)}
	if parent.fd < 0 && parent.path != "" {
		return d, nil
	}
	// O_RDONLY, not O_PATH: one listing (names with "") can use the fd.
	fd, err := openDirFD(parent.fdOrCwd(), d.pathOr(parent, name))
	if err != nil {
		return d, err
	}
	d.fd = fd
	return d, nil
}

// rootDir opens an absolute directory.
func (p *pass) rootDir(path string) dir { return p.openDir(dir{fd: -1}, path) }

func (p *pass) closeDir(d dir) {
	if d.fd >= 0 {
		unix.Close(d.fd)
	}
}

// readIn reads name in d. The bytes are the pass's buffer: valid until the
// next read.
func (p *pass) readIn(d dir, name string) ([]byte, error) {
	if d.fd < 0 || p.d.hooked {
		return p.d.readFile(d.join(name))
	}
	fd, err := openat(d.fd, name)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	defer unix.Close(fd)
	b, err := readFD(fd, p.buf[:0])
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: d.join(name), Err: err}
	}
	if cap(b) > cap(p.buf) {
		p.buf = b[:0] // keep the larger buffer
	}
	return b, nil
}

// names lists the entries of name in d (unsorted, without . and ..).
func (p *pass) names(d dir, name string) ([]string, error) {
	if d.fd < 0 {
		return dirNames(d.join(name))
	}
	fd := d.fd // name "": d itself, listed once
	if name != "" {
		var err error
		if fd, err = openDirFD(d.fd, name); err != nil {
			return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
		}
		defer unix.Close(fd)
	}
	out, err := direntNames(fd, p.dents)
	if err != nil {
		return nil, &fs.PathError{Op: "readdirent", Path: d.join(name), Err: err}
	}
	return out, nil
}

// isDirIn reports whether name in d is a directory, following symlinks.
func (p *pass) isDirIn(d dir, name string) bool {
	if d.fd < 0 {
		fi, err := os.Stat(d.join(name))
		return err == nil && fi.IsDir()
	}
	var st unix.Stat_t
	return unix.Fstatat(d.fd, name, &st, 0) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// readlinkIn reads the symlink name in d.
func (p *pass) readlinkIn(d dir, name string) (string, error) {
	if d.fd < 0 {
		return os.Readlink(d.join(name))
	}
	b := p.buf[:cap(p.buf)]
	n, err := unix.Readlinkat(d.fd, name, b)
	if err != nil {
		return "", &fs.PathError{Op: "readlink", Path: d.join(name), Err: err}
	}
	return string(b[:n]), nil
}

// realPath is d's path with every symlink resolved: what the kernel
// resolved when d was opened, as /proc/self/fd tells it.
func (p *pass) realPath(d dir) (string, error) {
	if d.fd >= 0 {
		b := p.buf[:cap(p.buf)]
		if n, err := unix.Readlink("/proc/self/fd/"+strconv.Itoa(d.fd), b); err == nil && n < len(b) && n > 0 && b[0] == '/' {
			return string(b[:n]), nil
		}
	}
	return filepath.EvalSymlinks(d.path)
}

func openat(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

func (d dir) fdOrCwd() int {
	if d.fd < 0 {
		return unix.AT_FDCWD
	}
	return d.fd
}

// pathOr is what to open: name relative to parent's fd, else the full path.
func (d dir) pathOr(parent dir, name string) string {
	if parent.fd < 0 {
		return d.path
	}
	return name
}

// identity is the device and inode of name in d, symlinks followed: a
// device removed and added again under its name has another.
func (p *pass) identity(d dir, name string) (devIdent, bool) {
	var st unix.Stat_t
	path := name
	if d.fd < 0 {
		path = d.join(name)
	}
	if unix.Fstatat(d.fdOrCwd(), path, &st, 0) != nil {
		return devIdent{}, false
	}
	return devIdent{uint64(st.Dev), uint64(st.Ino)}, true
}
