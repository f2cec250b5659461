//go:build !linux

package main

import "errors"

func openHostNetns(int) (netnsKernel, error) {
	return nil, errors.New("network namespaces exist on Linux only")
}
