package rdmacg

import "syscall"

var (
	errInval = syscall.EINVAL
	errNoDev = syscall.ENODEV
)
