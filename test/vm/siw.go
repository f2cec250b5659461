package vm

// Debian builds no soft-iWARP (CONFIG_RDMA_SIW is not set). This builds
// siw.ko from linux-source against the matching linux-headers, cached by
// kernel version; it loads unsigned (signatures are not enforced).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// BuildSiw returns the path of a siw.ko for the kernel image package img
// (release e.g. 6.1.0-57-amd64), building it once. The error says exactly
// what was missing.
func (c *Cache) BuildSiw(ctx context.Context, img Package, release string) (string, error) {
	out := filepath.Join(c.Dir, "siw", img.Version, release, "siw.ko")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	for _, tool := range []string{"make", "gcc", "tar", "xz"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("building siw needs %s, which is not installed", tool)
		}
	}
	hdrName := "linux-headers-" + release
	hdr, err := c.Show(ctx, hdrName)
	if err != nil {
		return "", err
	}
	common, err := dependsOn(hdr.Depends, "linux-headers-")
	if err != nil {
		return "", fmt.Errorf("%s: %w", hdrName, err)
	}
	kbuild, err := dependsOn(hdr.Depends, "linux-kbuild-")
	if err != nil {
		return "", fmt.Errorf("%s: %w", hdrName, err)
	}
	m := regexp.MustCompile(`^(\d+\.\d+)\.`).FindStringSubmatch(img.Version)
	if m == nil {
		return "", fmt.Errorf("kernel package version %q: no major.minor", img.Version)
	}
	srcName := "linux-source-" + m[1]
	pkgs, err := c.Get(ctx, hdrName, common, kbuild, srcName)
	if err != nil {
		return "", err
	}
	for _, p := range pkgs {
		if p.Version != img.Version {
			return "", fmt.Errorf("%s is %s but the kernel is %s: siw would not load", p.Name, p.Version, img.Version)
		}
	}
	gccVer, err := kernelCompiler(filepath.Join(pkgs[0].Root, "usr/src", hdrName, ".kernelvariables"))
	if err != nil {
		return "", err
	}
	if _, err := exec.LookPath(gccVer); err != nil {
		return "", fmt.Errorf("the kernel was built with %s, which is not installed (apt-get install %s)", gccVer, gccVer)
	}

	work, err := os.MkdirTemp(c.Dir, "siw-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	c.logf("building siw.ko for %s (%s)", release, img.Version)
	// The headers tree and the common tree it includes, side by side, with
	// the absolute include rewritten to this copy.
	for _, p := range pkgs[:3] {
		if _, err := run(ctx, "", "cp", "-a", p.Root+"/.", work); err != nil {
			return "", err
		}
	}
	hdrDir := filepath.Join(work, "usr/src", hdrName)
	mk, err := os.ReadFile(filepath.Join(hdrDir, "Makefile"))
	if err != nil {
		return "", fmt.Errorf("%s: %w", hdrName, err)
	}
	mk = []byte(strings.ReplaceAll(string(mk), "include /usr/src/", "include "+work+"/usr/src/"))
	if err := os.WriteFile(filepath.Join(hdrDir, "Makefile"), mk, 0o644); err != nil {
		return "", err
	}
	tarball := filepath.Join(pkgs[3].Root, "usr/src", srcName+".tar.xz")
	sub := srcName + "/drivers/infiniband/sw/siw"
	if _, err := run(ctx, work, "tar", "-xJf", tarball, sub); err != nil {
		return "", fmt.Errorf("extracting siw from %s: %w", tarball, err)
	}
	srcDir := filepath.Join(work, sub)
	if _, err := run(ctx, "", "make", "-s", "-C", hdrDir, "M="+srcDir, "CONFIG_RDMA_SIW=m", "modules"); err != nil {
		return "", fmt.Errorf("building siw: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(srcDir, "siw.ko"))
	if err != nil {
		return "", fmt.Errorf("building siw: %w", err)
	}
	if err := os.WriteFile(out+".tmp", b, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(out+".tmp", out); err != nil {
		return "", err
	}
	// The unpacked trees served this build only (the .debs stay).
	for _, p := range pkgs {
		_ = os.RemoveAll(p.Root)
	}
	return out, nil
}

// kernelCompiler reads the compiler (gcc-12) from the headers'
// .kernelvariables: a module must be built with the kernel's compiler.
func kernelCompiler(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("the kernel's compiler: %w", err)
	}
	m := regexp.MustCompile(`\$\(CROSS_COMPILE\)(gcc-\d+)`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("%s: no gcc-N in CC", path)
	}
	return string(m[1]), nil
}
