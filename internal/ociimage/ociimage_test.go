package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteLayout reads a written tarball back as an importer would:
// index → manifest → config and layer, every blob matching its digest, the
// layer holding the files with parents, modes and links.
func TestWriteLayout(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "prog")
	if err := os.WriteFile(src, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	err := Write(out, Image{Name: "example.com/a/b:v1", Entrypoint: []string{"/usr/bin/prog"}, User: "0", Files: []File{
		{Path: "/usr/bin/prog", Mode: 0o755, Source: src},
		{Path: "/bin/sh", Mode: os.ModeSymlink, Linkname: "busybox"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(out, Image{Name: "no-tag"}); err == nil {
		t.Error("a name without a tag was accepted")
	}
	blobs := map[string][]byte{}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		blobs[h.Name] = b
	}
	blob := func(digest string) []byte {
		b, ok := blobs["blobs/sha256/"+digest[len("sha256:"):]]
		sum := sha256.Sum256(b)
		if !ok || "sha256:"+hex.EncodeToString(sum[:]) != digest {
			t.Fatalf("blob %s missing or corrupt", digest)
		}
		return b
	}
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(blobs["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, blobs["index.json"])
	}
	if got := index.Manifests[0].Annotations["io.containerd.image.name"]; got != "example.com/a/b:v1" {
		t.Errorf("image name annotation %q", got)
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v", err)
	}
	var config struct {
		Config struct{ Entrypoint []string }
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(blob(manifest.Config.Digest), &config); err != nil || config.Config.Entrypoint[0] != "/usr/bin/prog" {
		t.Fatalf("config: %v %+v", err, config)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(manifest.Layers[0].Digest)))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(zr)
	sum := sha256.Sum256(raw)
	if "sha256:"+hex.EncodeToString(sum[:]) != config.RootFS.DiffIDs[0] {
		t.Error("diff_id does not match the uncompressed layer")
	}
	got := map[string]string{}
	lr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = string(rune(h.Typeflag)) + h.Linkname + " " + os.FileMode(h.Mode).String()
	}
	want := map[string]string{"bin/": "5 -rwxr-xr-x", "bin/sh": "2busybox -rwxrwxrwx", "usr/": "5 -rwxr-xr-x", "usr/bin/": "5 -rwxr-xr-x", "usr/bin/prog": "0 -rwxr-xr-x"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("layer entry %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}
