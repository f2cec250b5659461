package main

import (
	"fmt"
	"path/filepath"

	"github.com/rdma-dra/rdma-dra-driver/internal/hookbin"
)

// pinHook points --hook-path at the pinned copy of this image's hook when
// --hook-source names it. Without it (a hook built beside the driver, as
// in tests) specs name --hook-path as given.
func pinHook(o *options) error {
	if o.hookSource == "" || !filepath.IsAbs(o.hookPath) {
		return nil
	}
	p, err := hookbin.PinnedPath(o.hookPath, o.hookSource)
	if err != nil {
		return fmt.Errorf("--hook-source=%s: %w", o.hookSource, err)
	}
	o.hookPath = p
	return nil
}
