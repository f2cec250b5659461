package hcatest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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

// charDev makes /dev/infiniband/<name>: a character device as root, an
// empty file otherwise.
func (b *builder) charDev(name string, dn devNum) error {
	path := filepath.Join(b.n.DevRoot, "infiniband", name)
	if !b.n.CharDevices {
		return os.WriteFile(path, nil, 0o666)
	}
	if err := syscall.Mknod(path, syscall.S_IFCHR|0o666, dn.mkdev()); err != nil {
		return &fs.PathError{Op: "mknod", Path: path, Err: err}
	}
	return os.Chmod(path, 0o666) // undo the umask, as udev does
}
