package hcatest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Device numbers, as ib_uverbs, ib_umad and misc allocate them.
const (
	ibMajor           = 231
	uverbsBaseMinor   = 192
	uverbsFixedMinors = 32
	umadFixedMinors   = 64 // issm minors follow the umad ones
	// Beyond the fixed ranges the kernel allocates a dynamic major; these
	// are typical values.
	uverbsDynMajor = 243
	umadDynMajor   = 244
	umadDynMinors  = 1024 - umadFixedMinors
	miscMajor      = 10
)

type devNum struct{ major, minor uint32 }

func (d devNum) String() string { return fmt.Sprintf("%d:%d", d.major, d.minor) }

// mkdev encodes a device number for mknod(2), as glibc makedev and unix.Mkdev do.
func (d devNum) mkdev() int {
	ma, mi := uint64(d.major), uint64(d.minor)
	return int(mi&0xff | (ma&0xfff)<<8 | (mi&^0xff)<<12 | (ma&^0xfff)<<32)
}

func uverbsDev(n int) devNum {
	if n < uverbsFixedMinors {
		return devNum{ibMajor, uint32(uverbsBaseMinor + n)}
	}
	return devNum{uverbsDynMajor, uint32(n - uverbsFixedMinors)}
}

func umadDev(n int) devNum {
	if n < umadFixedMinors {
		return devNum{ibMajor, uint32(n)}
	}
	return devNum{umadDynMajor, uint32(n - umadFixedMinors)}
}

func issmDev(n int) devNum {
	if n < umadFixedMinors {
		return devNum{ibMajor, uint32(umadFixedMinors + n)}
	}
	return devNum{umadDynMajor, uint32(umadDynMinors + n - umadFixedMinors)}
}

// NodeMode is the mode udev gives /dev/infiniband/<name> with rdma-core's
// rules: uverbs and rdma_cm open to every user (verbs and RDMA CM need no
// privilege), umad and issm to root only (management datagrams, the
// subnet manager's flag).
func NodeMode(name string) fs.FileMode {
	if strings.HasPrefix(name, "umad") || strings.HasPrefix(name, "issm") {
		return 0o600
	}
	return 0o666
}

// charDev makes /dev/infiniband/<name> with its NodeMode: a character
// device as root, an empty file otherwise.
func (b *builder) charDev(name string, dn devNum) error {
	path := filepath.Join(b.n.DevRoot, "infiniband", name)
	mode := NodeMode(name)
	if !b.n.CharDevices {
		if err := os.WriteFile(path, nil, mode); err != nil {
			return err
		}
		return os.Chmod(path, mode)
	}
	if err := syscall.Mknod(path, syscall.S_IFCHR|uint32(mode), dn.mkdev()); err != nil {
		return &fs.PathError{Op: "mknod", Path: path, Err: err}
	}
	return os.Chmod(path, mode) // undo the umask, as udev does
}
