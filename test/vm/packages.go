// Package vm boots a real Linux kernel (Debian's) in QEMU with Soft-RoCE
// and soft-iWARP and runs guest test binaries in it.
//
// This file fetches Debian packages with apt (downloaded into a cache,
// never installed on the host) and unpacks them with dpkg-deb.
package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
)

// DefaultCacheDir is where packages, unpacked trees and built modules
// stay between runs: $RDMA_DRA_VM_CACHE, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/rdma-dra-driver/vm.
func DefaultCacheDir() (string, error) {
	if d := os.Getenv("RDMA_DRA_VM_CACHE"); d != "" {
		return d, nil
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no cache directory: set RDMA_DRA_VM_CACHE or HOME: %w", err)
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "rdma-dra-driver", "vm"), nil
}

// Cache holds downloaded .debs (debs/) and their unpacked trees (x/),
// keyed by package file name, which carries the version.
type Cache struct {
	Dir string
	// Log, if set, is told about downloads and builds (slow steps).
	Log func(format string, args ...any)

	mu    sync.Mutex
	shown map[string]Package // apt-cache show answers, by name
}

func (c *Cache) logf(format string, args ...any) {
	if c.Log != nil {
		c.Log(format, args...)
	}
}

// Package is one resolved Debian package.
type Package struct {
	Name     string
	Version  string
	Depends  string // the raw Depends field
	Filename string // pool path, e.g. pool/main/r/rdma-core/libibverbs1_44.0-2_amd64.deb
	Deb      string // local .deb after Fetch
	Root     string // unpacked tree after Unpack
}

// Show resolves name to the candidate version apt would install.
func (c *Cache) Show(ctx context.Context, name string) (Package, error) {
	ps, err := c.ShowAll(ctx, name)
	if err != nil {
		return Package{}, err
	}
	return ps[0], nil
}

// ShowAll resolves names with one apt-cache call, remembering the answers.
func (c *Cache) ShowAll(ctx context.Context, names ...string) ([]Package, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.shown == nil {
		c.shown = map[string]Package{}
	}
	var ask []string
	for _, n := range names {
		if _, ok := c.shown[n]; !ok {
			ask = append(ask, n)
		}
	}
	if len(ask) > 0 {
		out, err := run(ctx, "", "apt-cache", append([]string{"show", "--no-all-versions"}, ask...)...)
		if err != nil {
			return nil, fmt.Errorf("packages %v: %w (are they in the apt sources? run apt-get update)", ask, err)
		}
		for _, p := range parseStanzas(out) {
			if _, dup := c.shown[p.Name]; !dup && p.Version != "" && p.Filename != "" {
				c.shown[p.Name] = p
			}
		}
	}
	var ps []Package
	for _, n := range names {
		p, ok := c.shown[n]
		if !ok {
			return nil, fmt.Errorf("package %s: apt-cache show gave no Version/Filename", n)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// parseStanzas reads apt-cache show's output: stanzas split by blank lines.
func parseStanzas(out []byte) []Package {
	var ps []Package
	var p Package
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if sc.Text() == "" {
			if p.Name != "" {
				ps = append(ps, p)
			}
			p = Package{}
			continue
		}
		k, v, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		switch k {
		case "Package":
			p.Name = v
		case "Version":
			p.Version = v
		case "Depends":
			p.Depends = v
		case "Filename":
			p.Filename = v
		}
	}
	if p.Name != "" {
		ps = append(ps, p)
	}
	return ps
}

// Fetch downloads the package's .deb into the cache unless it is there.
func (c *Cache) Fetch(ctx context.Context, name string) (Package, error) {
	p, err := c.Show(ctx, name)
	if err != nil {
		return p, err
	}
	debs := filepath.Join(c.Dir, "debs")
	p.Deb = filepath.Join(debs, path.Base(p.Filename))
	if _, err := os.Stat(p.Deb); err == nil {
		return p, nil
	}
	tmp, err := os.MkdirTemp(c.Dir, "download-")
	if err != nil {
		return p, err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return p, err
	}
	c.logf("downloading %s=%s", name, p.Version)
	if _, err := run(ctx, tmp, "apt-get", "-q", "-o", "APT::Sandbox::User=root", "download", name+"="+p.Version); err != nil {
		return p, fmt.Errorf("package %s=%s: %w", name, p.Version, err)
	}
	got, err := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if err != nil || len(got) != 1 {
		return p, fmt.Errorf("package %s=%s: apt-get download left %v in %s", name, p.Version, got, tmp)
	}
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return p, err
	}
	return p, os.Rename(got[0], p.Deb)
}

// Unpack extracts the fetched .deb once (dpkg-deb -x) and sets p.Root.
func (c *Cache) Unpack(ctx context.Context, p *Package) error {
	root := filepath.Join(c.Dir, "x", strings.TrimSuffix(filepath.Base(p.Deb), ".deb"))
	if _, err := os.Stat(filepath.Join(root, ".unpacked")); err == nil {
		p.Root = root
		return nil
	}
	_ = os.RemoveAll(root)
	tmp := root + ".tmp"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	if _, err := run(ctx, "", "dpkg-deb", "-x", p.Deb, tmp); err != nil {
		return fmt.Errorf("unpacking %s: %w", p.Deb, err)
	}
	if err := os.WriteFile(filepath.Join(tmp, ".unpacked"), nil, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, root); err != nil {
		return err
	}
	p.Root = root
	return nil
}

// Get fetches and unpacks each package.
func (c *Cache) Get(ctx context.Context, names ...string) ([]Package, error) {
	if _, err := c.ShowAll(ctx, names...); err != nil {
		return nil, err
	}
	var out []Package
	for _, n := range names {
		p, err := c.Fetch(ctx, n)
		if err != nil {
			return nil, err
		}
		if err := c.Unpack(ctx, &p); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// dependsOn returns the first package named in a Depends field that has
// the prefix, e.g. "linux-image-" in linux-image-amd64's.
func dependsOn(depends, prefix string) (string, error) {
	for _, alt := range strings.Split(depends, ",") {
		for _, d := range strings.Split(alt, "|") {
			name, _, _ := strings.Cut(strings.TrimSpace(d), " ")
			name, _, _ = strings.Cut(name, ":")
			if strings.HasPrefix(name, prefix) {
				return name, nil
			}
		}
	}
	return "", fmt.Errorf("no %s* in Depends %q", prefix, depends)
}

// run runs a command and returns its stdout; the error carries stderr.
func run(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	if _, err := exec.LookPath(name); err != nil {
		return nil, fmt.Errorf("%s is not installed: %w", name, err)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = "..." + msg[len(msg)-2000:]
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out, fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, msg)
		}
		return out, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return out, nil
}
