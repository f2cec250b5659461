package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rdma-dra/rdma-dra-driver/internal/atomicfile"
	"github.com/rdma-dra/rdma-dra-driver/internal/hookbin"
)

// install copies this executable into dir on the host (the chart's init
// container runs it with the host's hook directory mounted), atomically:
// a runtime that is starting the old hook keeps its file, the next one
// gets the new one, and nobody sees half a binary. It writes the plain
// name, which specs of releases before pinning name, and the pinned name
// (hookbin), which this release's specs name and no other release
// overwrites: a container prepared before an upgrade or a rollback still
// starts with the hook its spec was written for.
func install(args []string, self func() (string, error)) error {
	if len(args) != 1 || !filepath.IsAbs(args[0]) {
		return errors.New("install: want one absolute directory, e.g. install /host/opt/rdma-dra-driver/bin")
	}
	dir := args[0]
	src, err := self()
	if err != nil {
		return fmt.Errorf("install: finding this executable: %w", err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	for _, name := range []string{hookbin.Name, hookbin.Pinned(b)} {
		dst := filepath.Join(dir, name)
		if err := atomicfile.Write(dst, b, atomicfile.WithMode(0o755)); err != nil {
			return fmt.Errorf("install: %w", err)
		}
		fmt.Printf("installed %s (%d bytes)\n", dst, len(b))
	}
	return nil
}
