package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

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
//
// Given the host's CDI spec directory as well, it then removes the pinned
// hooks of other releases that no spec there names (pruneUnused).
func install(args []string, self func() (string, error)) error {
	if len(args) < 1 || len(args) > 2 || !filepath.IsAbs(args[0]) || (len(args) == 2 && !filepath.IsAbs(args[1])) {
		return errors.New("install: want one absolute directory and optionally the CDI spec directory, e.g. install /host/opt/rdma-dra-driver/bin /host/var/run/cdi")
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
	if len(args) == 2 {
		pruneUnused(dir, args[1], hookbin.Pinned(b), time.Now())
	}
	return nil
}

// pruneMinAge spares a pinned hook installed this recently: during a
// rolling update with surge, another release's init container may have
// installed it and its daemon not yet written the specs that name it.
const pruneMinAge = time.Hour

// pruneUnused removes from dir the pinned hooks, other than current, that
// are older than pruneMinAge and named by no file in cdiDir. The daemon
// rewrites every spec of its prepared claims at start, naming its own
// pinned hook, so an older release's copy is named only until then, and a
// container starting later never needs it. Anything it cannot read or
// remove is kept and said: pruning is housekeeping, never a reason to fail
// the install.
func pruneUnused(dir, cdiDir, current string, now time.Time) {
	specs, err := os.ReadDir(cdiDir)
	if err != nil {
		fmt.Printf("not pruning pinned hooks: %v\n", err)
		return
	}
	var named [][]byte
	for _, e := range specs {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(cdiDir, e.Name()))
		if err != nil {
			fmt.Printf("not pruning pinned hooks: %v\n", err)
			return
		}
		named = append(named, b)
	}
	hooks, err := os.ReadDir(dir)
	if err != nil {
		fmt.Printf("not pruning pinned hooks: %v\n", err)
		return
	}
	for _, e := range hooks {
		name := e.Name()
		if name == current || !hookbin.IsPinned(name) || !e.Type().IsRegular() {
			continue
		}
		if info, err := e.Info(); err != nil || now.Sub(info.ModTime()) < pruneMinAge {
			continue
		}
		if slices.ContainsFunc(named, func(spec []byte) bool { return bytes.Contains(spec, []byte(name)) }) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			fmt.Printf("keeping unused pinned hook %s: %v\n", name, err)
			continue
		}
		fmt.Printf("removed unused pinned hook %s (no CDI spec in %s names it)\n", name, cdiDir)
	}
}
