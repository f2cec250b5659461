package node

// Images the node runs, built locally as OCI tarballs (no registry is
// needed): the sandbox's pause image, busybox for workloads, and the
// driver's image from `make image`.

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/rdma-dra/rdma-dra-driver/internal/ociimage"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

// DriverImage is the name `make image` gives the driver's image by default.
const DriverImage = "ghcr.io/rdma-dra/rdma-dra-driver:dev"

// baseImages writes the pause and busybox images into the work dir.
func (n *Node) baseImages() ([]string, error) {
	pause := n.path("images", "pause.tar")
	if err := ociimage.Write(pause, ociimage.Image{
		Name:       PauseImage,
		Entrypoint: []string{"/pause"},
		User:       "65535:65535",
		Files:      []ociimage.File{{Path: "/pause", Mode: 0o755, Source: n.Bin.Pause}},
	}); err != nil {
		return nil, fmt.Errorf("pause image: %w", err)
	}
	img, err := busyboxImage()
	if err != nil {
		return nil, err
	}
	busybox := n.path("images", "busybox.tar")
	if err := ociimage.Write(busybox, img); err != nil {
		return nil, fmt.Errorf("busybox image: %w", err)
	}
	return []string{pause, busybox}, nil
}

// busyboxImage is a static busybox (the host's, else Debian's unpacked into
// the cache) with a link per applet.
func busyboxImage() (ociimage.Image, error) {
	path, err := busyboxPath()
	if err != nil {
		return ociimage.Image{}, fmt.Errorf("busybox image: %w", err)
	}
	out, err := exec.Command(path, "--list").Output()
	if err != nil {
		return ociimage.Image{}, fmt.Errorf("busybox image: %s --list: %w", path, err)
	}
	img := ociimage.Image{
		Name: BusyboxImage,
		Cmd:  []string{"sh"},
		Files: []ociimage.File{
			{Path: "/bin/busybox", Mode: 0o755, Source: path},
			{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
			{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\n")},
			{Path: "/root", Dir: true, Mode: 0o700},
			{Path: "/tmp", Dir: true, Mode: 0o777 | os.ModeSticky},
		},
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet != "busybox" && !strings.Contains(applet, "/") {
			img.Files = append(img.Files, ociimage.File{Path: "/bin/" + applet, Mode: os.ModeSymlink, Linkname: "busybox"})
		}
	}
	return img, nil
}

// checkStatic fails unless path is a static ELF executable: the workload
// image has no libc.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s %w", path, errDynamic)
		}
	}
	return nil
}

// BuildDriverImage runs `make image` with its outputs in dir (BIN=dir, so
// concurrent test processes do not share bin/) and returns the tarball,
// named DriverImage: the same target and image users build.
func BuildDriverImage(dir string) (string, error) {
	tarball := filepath.Join(dir, "rdma-dra-driver-image.tar")
	cmd := exec.Command("make", "-s", "-C", cluster.RepoRoot(), "image", "BIN="+dir, "IMAGE_TAR="+tarball, "IMAGE="+DriverImage)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("make image: %v\n%s", err, LastLines(string(out), 30))
	}
	return tarball, nil
}
