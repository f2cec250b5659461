//go:build unix

package hca

import (
	"io/fs"

	"golang.org/x/sys/unix"
)

// readSysfs reads a sysfs attribute with three system calls (open, read,
// close): os.ReadFile adds a poller registration and a read to see EOF,
// which double the cost of the 1024-slot GID tables rxe has.
func readSysfs(path string) ([]byte, error) {
	fd, err := open(path)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var buf [256]byte // attributes are a few bytes
	out, err := readFD(fd, buf[:0])
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	return append([]byte(nil), out...), nil
}

// readFD reads fd from its offset to its end into buf.
func readFD(fd int, buf []byte) ([]byte, error) { return readToEnd(fd, buf, false) }

// readToEnd reads fd to its end into buf, growing it when the file is
// longer: with pread, from offset 0 without moving the file's offset; else
// with read, from the file's offset. A read that returns less than asked is
// the whole file, for sysfs attributes (one show call fills them) as for
// regular files.
func readToEnd(fd int, buf []byte, pread bool) ([]byte, error) {
	out := buf[:0]
	for {
		if len(out) == cap(out) {
			out = append(out, 0)[:len(out)] // grow: a long file, not an attribute
		}
		var n int
		var err error
		if pread {
			n, err = unix.Pread(fd, out[len(out):cap(out)], int64(len(out)))
		} else {
			n, err = unix.Read(fd, out[len(out):cap(out)])
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		short := len(out)+n < cap(out)
		out = out[:len(out)+n]
		if n == 0 || short {
			return out, nil
		}
	}
}

func open(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}
