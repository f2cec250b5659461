// Command rdma-image writes the driver's container image as an OCI
// image-layout tarball without Docker (`make image`): every file of --bin
// goes to /usr/bin, the entrypoint is /usr/bin/rdma-dra-driver, user 0.
// `ctr -n k8s.io images import` loads the result; the Dockerfile builds the
// same layout where a Docker engine runs (`make docker-image`).
//
//	rdma-image --name ghcr.io/rdma-dra/rdma-dra-driver:dev --bin bin/image --out bin/rdma-dra-driver-image.tar
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rdma-dra/rdma-dra-driver/internal/ociimage"
)

func main() {
	name := flag.String("name", "ghcr.io/rdma-dra/rdma-dra-driver:dev", "image reference")
	bin := flag.String("bin", "", "directory of static binaries for /usr/bin")
	out := flag.String("out", "", "tarball to write")
	flag.Parse()
	if err := run(*name, *bin, *out); err != nil {
		fmt.Fprintln(os.Stderr, "rdma-image:", err)
		os.Exit(1)
	}
}

func run(name, bin, out string) error {
	if bin == "" || out == "" {
		return fmt.Errorf("--bin and --out are required")
	}
	img, err := DriverImage(name, bin)
	if err != nil {
		return err
	}
	if err := ociimage.Write(out, img); err != nil {
		return err
	}
	fmt.Printf("%s: %s\n", out, name)
	return nil
}

// DriverImage is the image the Dockerfile builds: the binaries in /usr/bin
// on an otherwise empty root (passwd for root and nonroot, /tmp).
func DriverImage(name, bin string) (ociimage.Image, error) {
	entries, err := os.ReadDir(bin)
	if err != nil {
		return ociimage.Image{}, err
	}
	img := ociimage.Image{
		Name:       name,
		Entrypoint: []string{"/usr/bin/rdma-dra-driver"},
		User:       "0",
		Files: []ociimage.File{
			{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
			{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
			{Path: "/tmp", Dir: true, Mode: 0o777 | os.ModeSticky},
		},
	}
	found := false
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		img.Files = append(img.Files, ociimage.File{Path: "/usr/bin/" + e.Name(), Mode: 0o755, Source: filepath.Join(bin, e.Name())})
		found = found || e.Name() == "rdma-dra-driver"
	}
	if !found {
		return ociimage.Image{}, fmt.Errorf("%s has no rdma-dra-driver binary", bin)
	}
	return img, nil
}
