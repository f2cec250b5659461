// Package ociimage writes container images as OCI image-layout tarballs
// (oci-layout, index.json, blobs/sha256/...), the format `ctr images import`
// reads. It builds images from local files only: no registry, no Docker.
// One image per tarball, one gzip layer per image, linux/amd64 (GOARCH).
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// File is one entry of the image's single layer.
type File struct {
	Path     string // absolute path in the image, e.g. /usr/bin/rdma-dra-driver
	Mode     os.FileMode
	Data     []byte // regular files
	Source   string // or a file on the host to read Data from
	Linkname string // symlinks (Mode has os.ModeSymlink)
	Dir      bool
}

// Image is what goes into the tarball.
type Image struct {
	Name       string // full reference, e.g. ghcr.io/rdma-dra/rdma-dra-driver:dev
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	Files      []File
}

// fixed time keeps layers, and so digests, reproducible.
var epoch = time.Unix(0, 0).UTC()

// Write writes img as an OCI layout tarball to path (atomically: temp file
// and rename).
func Write(path string, img Image) error {
	if img.Name == "" || !strings.Contains(img.Name, ":") {
		return fmt.Errorf("image name %q: want repository:tag", img.Name)
	}
	layer, diffID, err := layerTar(img.Files)
	if err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	config := map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config": map[string]any{
			"Entrypoint": img.Entrypoint,
			"Cmd":        img.Cmd,
			"Env":        append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, img.Env...),
			"User":       img.User,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	}
	configBlob, err := json.Marshal(config)
	if err != nil {
		return err
	}
	manifest := map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", configBlob, nil),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layer, nil)},
	}
	manifestBlob, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	tag := img.Name[strings.LastIndex(img.Name, ":")+1:]
	md := descriptor("application/vnd.oci.image.manifest.v1+json", manifestBlob, map[string]string{
		"io.containerd.image.name":          img.Name,
		"org.opencontainers.image.ref.name": tag,
	})
	md["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{md},
	})
	if err != nil {
		return err
	}

	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".image-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(configBlob), configBlob},
		{blobPath(layer), layer},
		{blobPath(manifestBlob), manifestBlob},
	}
	if err := tw.WriteHeader(&tar.Header{Name: "blobs/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "blobs/sha256/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}); err != nil {
		return err
	}
	for _, e := range entries {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(b []byte) string {
	return "blobs/sha256/" + strings.TrimPrefix(digestOf(b), "sha256:")
}

func descriptor(mediaType string, b []byte, annotations map[string]string) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": digestOf(b), "size": len(b)}
	if annotations != nil {
		d["annotations"] = annotations
	}
	return d
}

// layerTar returns the gzipped layer and the digest of its uncompressed
// tar (the config's diff_id). Parent directories are added as needed.
func layerTar(files []File) ([]byte, string, error) {
	dirs := map[string]bool{}
	byPath := map[string]File{}
	for _, f := range files {
		p := filepath.Clean("/" + f.Path)
		if p == "/" {
			return nil, "", fmt.Errorf("file %q: not a path", f.Path)
		}
		f.Path = p
		byPath[p] = f
		for d := filepath.Dir(p); d != "/"; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		if _, ok := byPath[d]; !ok {
			byPath[d] = File{Path: d, Dir: true, Mode: 0o755}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)

	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, p := range paths {
		f := byPath[p]
		h := &tar.Header{Name: strings.TrimPrefix(p, "/"), Mode: int64(f.Mode.Perm()), ModTime: epoch, Format: tar.FormatPAX}
		if f.Mode&os.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		switch {
		case f.Dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case f.Mode&os.ModeSymlink != 0:
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Linkname, 0o777
		default:
			data := f.Data
			if f.Source != "" {
				b, err := os.ReadFile(f.Source)
				if err != nil {
					return nil, "", err
				}
				data = b
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
			if err := tw.WriteHeader(h); err != nil {
				return nil, "", err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, "", err
			}
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, "", err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	diffID := digestOf(raw.Bytes())
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if _, err := io.Copy(zw, &raw); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return gz.Bytes(), diffID, nil
}
