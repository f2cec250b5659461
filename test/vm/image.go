package vm

// The guest image: Debian's kernel, an initramfs with the RDMA modules,
// rdma-core and iproute2's tools, runc, busybox and the guest programs, and
// an /init that sets up Soft-RoCE (rxe0 on eth0, rxe1 on eth1) and
// soft-iWARP (siw0 on eth0, when built), then runs the guest program.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// KernelPackage is the metapackage whose dependency is the kernel booted.
const KernelPackage = "linux-image-amd64"

// userPackages are unpacked whole (their binaries are picked below);
// libPackages only serve shared libraries.
var (
	userPackages = []string{"busybox-static", "ibverbs-utils", "ibverbs-providers", "rdmacm-utils",
		"libibverbs1", "librdmacm1", "iproute2", "runc"}
	libPackages = []string{"libc6", "libgcc-s1", "libnl-3-200", "libnl-route-3-200", "libseccomp2",
		"libmnl0", "libelf1", "libbpf1", "libcap2", "libbsd0", "libmd0", "zlib1g"}
	// userBinaries: guest path -> path in the unpacked packages.
	userBinaries = map[string]string{
		"/usr/bin/ibv_devinfo":     "usr/bin/ibv_devinfo",
		"/usr/bin/ibv_devices":     "usr/bin/ibv_devices",
		"/usr/bin/ibv_rc_pingpong": "usr/bin/ibv_rc_pingpong",
		"/usr/bin/ibv_ud_pingpong": "usr/bin/ibv_ud_pingpong",
		"/usr/bin/rping":           "usr/bin/rping",
		"/usr/bin/rdma":            "usr/bin/rdma",
		"/sbin/ip":                 "sbin/ip",
		"/usr/sbin/runc":           "usr/sbin/runc",
	}
	// Module roots; their dependencies follow from .modinfo. crc32 and
	// crc32c are crypto algorithms rxe and siw look up at run time (no
	// declared dependency: rdma_rxe fails with ENOENT without them).
	moduleRoots = []string{"virtio_pci", "virtio_net", "crc32_generic", "crc32c_generic",
		"ib_uverbs", "rdma_ucm", "ib_umad", "rdma_rxe"}
)

// Image is what a boot needs.
type Image struct {
	Kernel     string // vmlinuz
	Release    string // 6.1.0-57-amd64
	KernelVer  string // Debian package version, 6.1.192-3
	Initrd     string // the cpio archive
	Siw        bool   // siw.ko is in the image
	SiwSkipped string // why not, when not
}

// GuestFile is a host file put into the image.
type GuestFile struct {
	Path string // in the guest
	Src  string // on the host
}

// ImageSpec says what goes into an image beyond the fixed setup.
type ImageSpec struct {
	Files []GuestFile // added as they are
	Prog  string      // run as Prog Args... with Env after the setup
	Args  []string
	Env   []string
	Siw   bool // build and load soft-iWARP
	// Modules are loaded besides the RDMA ones (and their dependencies),
	// e.g. overlay, bridge and veth for a node's containers.
	Modules []string
	// Without leaves modules out (a test of the harness's error path).
	Without []string
}

// Build assembles the image in dir.
func (c *Cache) Build(ctx context.Context, dir string, spec ImageSpec) (*Image, error) {
	files, prog, args, env, withSiw := spec.Files, spec.Prog, spec.Args, append([]string{}, spec.Env...), spec.Siw
	// A cold cache: whichever test builds first makes the directory.
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("VM cache: %w", err)
	}
	meta, err := c.Show(ctx, KernelPackage)
	if err != nil {
		return nil, err
	}
	imgName, err := dependsOn(meta.Depends, "linux-image-")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KernelPackage, err)
	}
	kpkgs, err := c.Get(ctx, imgName)
	if err != nil {
		return nil, err
	}
	kimg := kpkgs[0]
	release := strings.TrimPrefix(imgName, "linux-image-")
	im := &Image{Release: release, KernelVer: kimg.Version,
		Kernel: filepath.Join(kimg.Root, "boot", "vmlinuz-"+release)}
	if _, err := os.Stat(im.Kernel); err != nil {
		return nil, fmt.Errorf("%s: no kernel: %w", imgName, err)
	}
	mods, err := LoadModules(kimg.Root, release)
	if err != nil {
		return nil, err
	}
	var roots []string
	for _, m := range append(append([]string{}, moduleRoots...), spec.Modules...) {
		if !slices.Contains(spec.Without, m) {
			roots = append(roots, m)
		}
	}
	if withSiw {
		if ko, err := c.BuildSiw(ctx, kimg, release); err != nil {
			im.SiwSkipped = "siw.ko could not be built: " + err.Error()
		} else {
			mods.Add(ko)
			roots = append(roots, "siw")
			im.Siw = true
		}
	} else {
		im.SiwSkipped = "siw disabled (RDMA_DRA_VM_SIW=0)"
	}
	// The guest tests learn whether siw is there, or why not.
	if im.Siw {
		env = append(env, "RDMA_DRA_VM_SIW=1")
	} else {
		env = append(env, "RDMA_DRA_VM_SIW_SKIP="+im.SiwSkipped)
	}
	order, err := mods.Order(roots...)
	if err != nil {
		return nil, err
	}

	user, lib, err := c.userland(ctx)
	if err != nil {
		return nil, err
	}
	t := NewTree()
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp", "root", "etc", "var", "mnt"} {
		t.Dir(d, 0o755)
	}
	t.Copy("bin/busybox", filepath.Join(user[0].Root, "bin/busybox"), 0o755)
	if err := addUserland(t, lib, user, userBinaries); err != nil {
		return nil, err
	}
	var insmods []string
	for i, ko := range order {
		g := fmt.Sprintf("/lib/modules/%s/%02d-%s", release, i, filepath.Base(ko))
		t.Copy(g, ko, 0o644)
		insmods = append(insmods, g)
	}
	for _, f := range files {
		t.Copy(f.Path, f.Src, 0o755)
	}
	t.File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	t.File("etc/group", 0o644, []byte("root:x:0:\n"))
	t.File("etc/hosts", 0o644, []byte("127.0.0.1 localhost\n"))
	t.File("init", 0o755, []byte(initScript(insmods, im.Siw, prog, args, env)))

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	im.Initrd = filepath.Join(dir, "initramfs.cpio")
	f, err := os.Create(im.Initrd)
	if err != nil {
		return nil, err
	}
	if _, err := t.WriteTo(f); err != nil {
		f.Close()
		return nil, err
	}
	return im, f.Close()
}

// userland fetches the user and library packages and resolves libraries
// from them.
func (c *Cache) userland(ctx context.Context) ([]Package, *Libraries, error) {
	user, err := c.Get(ctx, userPackages...)
	if err != nil {
		return nil, nil, err
	}
	libs, err := c.Get(ctx, libPackages...)
	if err != nil {
		return nil, nil, err
	}
	var roots []string
	for _, p := range append(user, libs...) {
		roots = append(roots, p.Root)
	}
	return user, NewLibraries(roots...), nil
}

// addUserland puts binaries (guest path -> path in the unpacked packages)
// into t with their libraries, and what rdma-core loads at run time: libgcc_s
// and the verbs providers with their driver files.
func addUserland(t *Tree, lib *Libraries, user []Package, binaries map[string]string) error {
	for guest, rel := range binaries {
		src, ok := findIn(user, rel)
		if !ok {
			return fmt.Errorf("%s is in none of the packages %v", rel, userPackages)
		}
		if err := lib.AddELF(t, guest, src); err != nil {
			return err
		}
	}
	// glibc dlopens libgcc_s for thread exit and cancellation (rping).
	if guest, host, ok := lib.find("libgcc_s.so.1"); ok {
		t.Copy(guest, host, 0o755)
	} else {
		return fmt.Errorf("libgcc_s.so.1 is in none of the packages %v", libPackages)
	}
	// Verbs providers are dlopened: their directory and driver files.
	for _, rel := range []string{"usr/lib/x86_64-linux-gnu/libibverbs", "etc/libibverbs.d"} {
		p, ok := findIn(user, rel)
		if !ok {
			return fmt.Errorf("%s is in none of the packages %v", rel, userPackages)
		}
		if err := lib.AddDir(t, strings.TrimSuffix(p, "/"+rel), rel); err != nil {
			return err
		}
	}
	return nil
}

func findIn(pkgs []Package, rel string) (string, bool) {
	for _, p := range pkgs {
		q := filepath.Join(p.Root, rel)
		if _, err := os.Lstat(q); err == nil {
			return q, true
		}
	}
	return "", false
}

// Markers on the result port (ttyS1).
const (
	markerExit  = "VMTEST-EXIT "
	markerError = "VMTEST-ERROR "
)

// initScript is the guest's PID 1: a busybox shell script. Every setup
// failure is reported on the result port with what failed and the kernel's
// last words, then the VM powers off.
func initScript(insmods []string, siw bool, prog string, args, env []string) string {
	var b strings.Builder
	b.WriteString(`#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
R=/dev/ttyS1
fail() { echo "` + markerError + `$*" > $R; dmesg | tail -n 5 | sed 's/^/` + markerError + `  dmesg: /' > $R; echo "` + markerExit + `99" > $R; sync; reboot -f; }
echo "init: loading modules"
`)
	for _, m := range insmods {
		fmt.Fprintf(&b, "insmod %s || fail \"module %s failed to load\"\n", m, filepath.Base(m))
	}
	b.WriteString(`echo "init: network"
ip link set lo up || fail "lo up"
for i in 0 1; do
  [ -e /sys/class/net/eth$i ] || fail "no eth$i (virtio-net did not come up)"
  ip addr add 10.0.$((2+i)).15/24 dev eth$i || fail "address on eth$i"
  ip link set eth$i up || fail "eth$i up"
done
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 type rxe netdev eth0"
rdma link add rxe1 type rxe netdev eth1 || fail "rdma link add rxe1 type rxe netdev eth1"
`)
	if siw {
		b.WriteString("rdma link add siw0 type siw netdev eth0 || fail \"rdma link add siw0 type siw netdev eth0\"\n")
	}
	b.WriteString(`for i in $(seq 50); do
  [ -e /dev/infiniband/uverbs1 ] && break; sleep 0.1
done
echo "init: ready after $(cut -d' ' -f1 /proc/uptime)s"
`)
	for _, e := range env {
		fmt.Fprintf(&b, "export %s\n", shellQuote(e))
	}
	fmt.Fprintf(&b, "cd /tmp\n%s", shellQuote(prog))
	for _, a := range args {
		b.WriteString(" " + shellQuote(a))
	}
	b.WriteString(` > $R 2>&1
echo "` + markerExit + `$?" > $R
sync
reboot -f
`)
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
