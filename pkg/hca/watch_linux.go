//go:build linux

package hca

import (
	"io/fs"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// portWatch keeps the state and phys_state files of every port open
// between PortStates calls and re-reads them with pread at offset 0, which
// makes sysfs call the attribute's show again (a fresh value, as after
// close and open). A poll costs a class listing, one stat per ibdev and one
// pread per file, instead of a directory listing and three system calls
// per file. Two descriptors per port are held.
//
// An ibdev's files are reopened when its directory is another one (driver
// reload: a new kernfs node, a new inode), and dropped when it leaves the
// class or a read fails (the kernel answers ENODEV once it is removed).
type portWatch struct {
	mu   sync.Mutex
	devs map[string]*watchedDev
	buf  [256]byte
}

type watchedDev struct {
	dev, ino uint64
	ports    []watchedPort
}

type watchedPort struct {
	name        string
	state, phys int // -1: the file could not be opened
}

func newPortWatch() *portWatch { return &portWatch{devs: map[string]*watchedDev{}} }

// portStates is Discoverer.PortStates on held files, unless reads go
// through a WithReadFile hook.
func (d *Discoverer) portStates() (map[string]string, bool, error) {
	if d.hooked || d.watch == nil {
		return nil, false, nil
	}
	m, err := d.watch.portStates(d.sysfsRoot)
	return m, true, err
}

func (w *portWatch) portStates(sysfsRoot string) (map[string]string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	classPath := filepath.Join(sysfsRoot, "class", "infiniband")
	class, err := openDirFD(unix.AT_FDCWD, classPath)
	if err == unix.ENOENT {
		w.closeAllLocked()
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: classPath, Err: err}
	}
	defer unix.Close(class)
	var dents [8 << 10]byte
	names, err := direntNames(class, dents[:])
	if err != nil {
		return nil, &fs.PathError{Op: "readdirent", Path: classPath, Err: err}
	}
	out := make(map[string]string, len(names))
	listed := make(map[string]bool, len(names))
	for _, name := range names {
		listed[name] = true
		if !w.readDev(class, name, out, dents[:]) {
			// A read failed: the ibdev went away or was replaced since
			// it was opened. Look at it afresh once.
			w.dropLocked(name)
			for k := range out {
				if len(k) > len(name) && k[:len(name)+1] == name+"/" {
					delete(out, k)
				}
			}
			w.readDev(class, name, out, dents[:])
		}
	}
	for name := range w.devs {
		if !listed[name] {
			w.dropLocked(name)
		}
	}
	return out, nil
}

// readDev puts name's ports in out; false when a held file failed.
func (w *portWatch) readDev(class int, name string, out map[string]string, dents []byte) bool {
	var st unix.Stat_t
	if err := unix.Fstatat(class, name, &st, 0); err != nil {
		w.dropLocked(name)
		out[name] = "unreadable"
		return true
	}
	dev := w.devs[name]
	if dev != nil && (dev.dev != uint64(st.Dev) || dev.ino != uint64(st.Ino)) {
		w.dropLocked(name)
		dev = nil
	}
	if dev == nil {
		dev = w.open(class, name, dents)
		if dev == nil {
			out[name] = "unreadable"
			return true
		}
		dev.dev, dev.ino = uint64(st.Dev), uint64(st.Ino)
		w.devs[name] = dev
	}
	for _, p := range dev.ports {
		v := make([]byte, 0, 32)
		for _, fd := range []int{p.state, p.phys} {
			if fd < 0 {
				continue
			}
			b, err := pread0(fd, w.buf[:0])
			if err != nil {
				return false
			}
			v = append(v, b...)
		}
		out[name+"/"+p.name] = string(v)
	}
	return true
}

// open opens the state files of name's ports; nil when its ports
// directory cannot be listed.
func (w *portWatch) open(class int, name string, dents []byte) *watchedDev {
	ports, err := openDirFD(class, name+"/ports")
	if err != nil {
		return nil
	}
	defer unix.Close(ports)
	names, err := direntNames(ports, dents)
	if err != nil {
		return nil
	}
	dev := &watchedDev{}
	for _, p := range names {
		dev.ports = append(dev.ports, watchedPort{
			name: p, state: openFile(ports, p+"/state"), phys: openFile(ports, p+"/phys_state"),
		})
	}
	return dev
}

func (w *portWatch) dropLocked(name string) {
	if dev := w.devs[name]; dev != nil {
		for _, p := range dev.ports {
			closeFD(p.state)
			closeFD(p.phys)
		}
		delete(w.devs, name)
	}
}

func (w *portWatch) closeAllLocked() {
	for name := range w.devs {
		w.dropLocked(name)
	}
}

func (w *portWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closeAllLocked()
}

func openDirFD(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// openFile opens name in dirfd for reading, or returns -1.
func openFile(dirfd int, name string) int {
	fd, err := openat(dirfd, name)
	if err != nil {
		return -1
	}
	return fd
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

// direntNames lists an open directory (without . and ..).
func direntNames(fd int, buf []byte) ([]string, error) {
	var out []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		_, _, out = unix.ParseDirent(buf[:n], -1, out)
	}
}

// pread0 reads a whole file from offset 0 into buf: sysfs calls the
// attribute's show again.
func pread0(fd int, buf []byte) ([]byte, error) { return readToEnd(fd, buf, true) }
