package node

// What a fresh machine may lack and the node can make for itself, so that
// `make demo` as root needs no `apt-get install`: runc, built from its Go
// module like containerd (cgo for its nsenter, libseccomp linked in
// statically from Debian's libseccomp-dev, fetched with `apt-get download`
// and unpacked into the cache, never installed), and a static busybox for
// the workload image, unpacked from Debian's busybox-static the same way.
// A host's own runc and static busybox are used when present.

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// RuncVersion is the runc the node builds when the host has none.
const RuncVersion = "v1.5.3"

const runcEntry = "runc-" + RuncVersion

// runcPath is the host's runc, else the one built into the cache.
func runcPath(logf func(string, ...any)) (string, error) {
	if p, err := exec.LookPath("runc"); err == nil {
		return p, nil
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	dir, err := cached(cache, runcEntry, logf, buildRunc)
	if err != nil {
		return "", fmt.Errorf("runc is not installed and could not be built (or apt-get install runc): %w", err)
	}
	return filepath.Join(dir, "runc"), nil
}

// buildRunc builds a static runc with seccomp support: containerd hands runc
// the RuntimeDefault seccomp profile, which a runc built without it refuses.
func buildRunc(dir string) error {
	deb, err := debianPackage("libseccomp-dev")
	if err != nil {
		return err
	}
	pc := filepath.Join(deb, "usr", "lib", multiarch(), "pkgconfig")
	cmd := exec.Command("go", "install", "-tags", "seccomp netgo osusergo",
		"-ldflags", "-extldflags -static", "github.com/opencontainers/runc@"+RuncVersion)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOBIN="+dir, "GOFLAGS=-buildvcs=false",
		"PKG_CONFIG_PATH="+pc, "PKG_CONFIG_LIBDIR="+pc, "PKG_CONFIG_SYSROOT_DIR="+deb)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go install runc@%s: %v\n%s", RuncVersion, err, LastLines(string(out), 30))
	}
	return nil
}

// hostStaticBusybox is the host's busybox when it is static; "" otherwise.
func hostStaticBusybox() string {
	p, err := exec.LookPath("busybox")
	if err != nil {
		return ""
	}
	if p, err = filepath.EvalSymlinks(p); err != nil || checkStatic(p) != nil {
		return ""
	}
	return p
}

// busyboxPath is a static busybox: the host's, else Debian's busybox-static
// unpacked into the cache.
func busyboxPath() (string, error) {
	if p := hostStaticBusybox(); p != "" {
		return p, nil
	}
	deb, err := debianPackage("busybox-static")
	if err != nil {
		return "", fmt.Errorf("no static busybox here and none could be fetched (or apt-get install busybox-static): %w", err)
	}
	p := filepath.Join(deb, "bin", "busybox")
	if err := checkStatic(p); err != nil {
		return "", err
	}
	return p, nil
}

// debianPackage unpacks Debian's package pkg (for this machine's
// architecture, from apt's configured sources) into the cache and returns
// the directory it was unpacked into.
func debianPackage(pkg string) (string, error) {
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	return cached(cache, "deb-"+pkg, func(string, ...any) {}, func(dir string) error {
		for _, tool := range []string{"apt-get", "dpkg-deb"} {
			if _, err := exec.LookPath(tool); err != nil {
				return fmt.Errorf("fetching Debian's %s needs %s: %w", pkg, tool, err)
			}
		}
		dl := exec.Command("apt-get", "download", "-q", pkg)
		dl.Dir = dir
		if out, err := dl.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get download %s: %v\n%s", pkg, err, LastLines(string(out), 10))
		}
		debs, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
		if len(debs) != 1 {
			return fmt.Errorf("apt-get download %s: want one .deb in %s, found %d", pkg, dir, len(debs))
		}
		if out, err := exec.Command("dpkg-deb", "-x", debs[0], dir).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %v\n%s", debs[0], err, out)
		}
		return os.Remove(debs[0])
	})
}

// multiarch is Debian's library directory name for this architecture.
func multiarch() string {
	switch runtime.GOARCH {
	case "arm64":
		return "aarch64-linux-gnu"
	default:
		return "x86_64-linux-gnu"
	}
}

// canFetch says why the node could not make what the host lacks ("" when it can).
func canFetch(what string) string {
	var missing []string
	for _, tool := range []string{"go", "apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if what == "runc" {
		if _, err := exec.LookPath("cc"); err != nil {
			if _, err := exec.LookPath("gcc"); err != nil {
				missing = append(missing, "a C compiler (runc's nsenter is cgo)")
			}
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("no %s here, and building or fetching one needs %s", what, strings.Join(missing, ", "))
}

var errDynamic = errors.New("is dynamically linked")
