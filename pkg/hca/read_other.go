//go:build !unix

package hca

import "os"

func readSysfs(path string) ([]byte, error) { return os.ReadFile(path) }
