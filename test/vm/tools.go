package vm

// The tools image: rdma-core's verbs tools from the guest's own packages,
// with busybox, as an OCI image for pods on the node in the guest.

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"

	"github.com/rdma-dra/rdma-dra-driver/internal/ociimage"
)

// ToolsImageName is the tools image's name on the node (never pulled).
const ToolsImageName = "localhost/rdma-dra/rdma-tools:1"

// toolsBinaries are the image's RDMA programs (guest path -> package
// path): rdma-core's, perftest's and UCX's, the clients of the two-node
// test (TestMultiNode).
var toolsBinaries = map[string]string{
	"/usr/bin/ibv_devinfo":     "usr/bin/ibv_devinfo",
	"/usr/bin/ibv_rc_pingpong": "usr/bin/ibv_rc_pingpong",
	"/usr/bin/rping":           "usr/bin/rping",
	"/usr/bin/ib_write_bw":     "usr/bin/ib_write_bw",
	"/usr/bin/ib_read_lat":     "usr/bin/ib_read_lat",
	"/usr/bin/ucx_perftest":    "usr/bin/ucx_perftest",
}

// The tools image's packages beyond the guest's userland, and the ones
// that only serve their libraries.
var (
	toolsPackages    = []string{"perftest", "ucx-utils", "libucx0"}
	toolsLibPackages = []string{"libibumad3", "libpci3", "libudev1", "libstdc++6", "libgomp1", "libnuma1"}
	// ucxModules are dlopened by libucs from next to itself: the verbs,
	// RDMA-CM and CMA transports.
	ucxModules = "usr/lib/x86_64-linux-gnu/ucx"
)

// busybox applets the image links (its scripts use no others).
var toolsApplets = []string{"sh", "cat", "cut", "echo", "env", "grep", "head", "ls", "seq", "sleep", "sort", "tail", "test", "tr", "wc",
	"awk", "sed", "ip", "expr"}

// ToolsImage writes the tools image as an OCI tarball at path.
func (c *Cache) ToolsImage(ctx context.Context, path string) error {
	user, _, err := c.userland(ctx)
	if err != nil {
		return err
	}
	extra, err := c.Get(ctx, append(append([]string{}, toolsPackages...), toolsLibPackages...)...)
	if err != nil {
		return fmt.Errorf("tools image: %w", err)
	}
	libs, err := c.Get(ctx, libPackages...)
	if err != nil {
		return err
	}
	var roots []string
	for _, p := range append(append(append([]Package{}, user...), extra...), libs...) {
		roots = append(roots, p.Root)
	}
	lib := NewLibraries(roots...)
	// UCX's modules link each other from their own directory ($ORIGIN).
	lib.dirs = append(lib.dirs, ucxModules)
	user = append(user, extra[:len(toolsPackages)]...)
	t := NewTree()
	t.Copy("bin/busybox", filepath.Join(user[0].Root, "bin/busybox"), 0o755)
	for _, a := range toolsApplets {
		t.Symlink("bin/"+a, "busybox")
	}
	t.Dir("tmp", 0o777|fs.ModeSticky)
	t.File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	if err := addUserland(t, lib, user, toolsBinaries); err != nil {
		return fmt.Errorf("tools image: %w", err)
	}
	ucx, ok := findIn(user, ucxModules)
	if !ok {
		return fmt.Errorf("tools image: %s is in none of the packages %v", ucxModules, toolsPackages)
	}
	if err := lib.AddDir(t, strings.TrimSuffix(ucx, "/"+ucxModules), ucxModules); err != nil {
		return fmt.Errorf("tools image: %w", err)
	}
	return ociimage.Write(path, ociimage.Image{Name: ToolsImageName, Cmd: []string{"sh"},
		Env: []string{"PATH=/usr/bin:/bin"}, Files: t.ociFiles()})
}

// ociFiles is the tree as an image layer's files.
func (t *Tree) ociFiles() []ociimage.File {
	var out []ociimage.File
	for p, e := range t.entries {
		f := ociimage.File{Path: "/" + p, Mode: e.mode, Data: e.data, Source: e.src}
		switch {
		case e.mode.IsDir():
			f.Dir, f.Mode = true, e.mode&(fs.ModePerm|fs.ModeSticky)
		case e.mode&fs.ModeSymlink != 0:
			f.Linkname = e.target
		}
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
