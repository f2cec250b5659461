//go:build !unix

package hca

import "io/fs"

// nodeNumber cannot read a device number here: the comparison with sysfs
// is skipped.
func nodeNumber(fs.FileInfo) (major, minor uint32, ok bool) { return 0, 0, false }
