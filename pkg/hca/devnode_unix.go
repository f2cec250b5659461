//go:build unix

package hca

import (
	"io/fs"
	"syscall"

	"golang.org/x/sys/unix"
)

// nodeNumber returns the device number a node's stat reports (its rdev);
// ok is false when fi carries none.
func nodeNumber(fi fs.FileInfo) (major, minor uint32, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	rdev := uint64(st.Rdev) // Rdev is uint64 on linux/amd64, 32 bits elsewhere
	return unix.Major(rdev), unix.Minor(rdev), true
}
