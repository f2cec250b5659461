package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rdma-dra/rdma-dra-driver/internal/atomicfile"
)

// install copies this executable into dir on the host (the chart's init
// container runs it with the host's hook directory mounted), atomically:
// a runtime that is starting the old hook keeps its file, the next one
// gets the new one, and nobody sees half a binary.
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
	dst := filepath.Join(dir, "rdma-dra-hook")
	if err := atomicfile.Write(dst, b, atomicfile.WithMode(0o755)); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	fmt.Printf("installed %s (%d bytes)\n", dst, len(b))
	return nil
}
