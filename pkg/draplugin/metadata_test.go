package draplugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
)

// files lists every file and directory under dir, relative, sorted.
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, rel)
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// plant writes a file, aged as a kill long ago would have left it.
func plant(t *testing.T, path string, age time.Duration) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-age)
	for p := path; p != filepath.Dir(p) && age > 0; p = filepath.Dir(p) {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(filepath.Dir(p), "dra-device-metadata") || strings.HasSuffix(filepath.Dir(p), "cdi") {
			break
		}
	}
}

// metadataAt reads the metadata file a container gets at path from the
// CDI devices ids, and decodes its first object.
func (e *env) metadataAt(path string, ids ...string) metadatav1beta1.DeviceMetadata {
	e.t.Helper()
	s := e.container(ids...)
	for _, m := range s.Mounts {
		if m.Destination != path {
			continue
		}
		raw, err := os.ReadFile(m.Source)
		if err != nil {
			e.t.Fatal(err)
		}
		var md metadatav1beta1.DeviceMetadata
		if err := json.NewDecoder(bytes.NewReader(raw)).Decode(&md); err != nil {
			e.t.Fatalf("decoding %s: %v\n%s", m.Source, err, raw)
		}
		return md
	}
	e.t.Fatalf("no mount at %s in %+v", path, s.Mounts)
	return metadatav1beta1.DeviceMetadata{}
}

// The metadata files are written without fsync: what a reboot can take (the
// CDI tmpfs emptied, a metadata file left empty) the next start rewrites
// from the checkpoint, at the same paths and CDI IDs the kubelet holds.
// Temp files a kill left, and files of claims no longer prepared, are
// removed once old enough; a claim's unprepare removes its own, temp files
// included.
func TestDeviceMetadataAcrossReboot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.cfg.DeviceMetadata = true
	e.start()
	c := e.claim("made-for-pod", hostNetworkPod("p", true), one("mlx5-8"))
	// Made from a ResourceClaimTemplate: the container path names the
	// pod's claim, not the generated claim.
	c.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: "rdma"}
	if _, err := e.client.ResourceV1().ResourceClaims("default").Update(context.Background(), c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ids := e.mustPrepare(c)
	const inContainer = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/rdma/hca/rdma.dra.dev-metadata.json"
	before := e.metadataAt(inContainer, ids...)
	if before.PodClaimName == nil || *before.PodClaimName != "rdma" || before.UID != c.UID || len(before.Requests) != 1 ||
		len(before.Requests[0].Devices) != 1 || len(before.Requests[0].Devices[0].Attributes) == 0 {
		t.Fatalf("metadata before the reboot: %+v", before)
	}

	// The reboot, and what kills long before it left.
	e.stop()
	for _, f := range files(t, e.cdiDir) {
		os.Remove(filepath.Join(e.cdiDir, f))
	}
	mdFile := filepath.Join(e.pluginDir, "dra-device-metadata", "default_made-for-pod", "hca", "metadata.json")
	if err := os.Truncate(mdFile, 0); err != nil {
		t.Fatal(err)
	}
	const gone, young = 2 * time.Minute, 0
	stale := []string{
		filepath.Join(e.cdiDir, ".rdma.dra.dev_metadata_uid-made-for-pod_hca.json.1234.tmp"),
		filepath.Join(e.cdiDir, ".rdma.dra.dev_metadata_uid-long-gone_hca.json.99.tmp"),
		filepath.Join(e.cdiDir, "rdma.dra.dev_metadata_uid-long-gone_hca.json"),
		filepath.Join(e.pluginDir, "dra-device-metadata", "default_made-for-pod", "hca", ".metadata.json.5678.tmp"),
		filepath.Join(e.pluginDir, "dra-device-metadata", "default_long-gone", "hca", "metadata.json"),
	}
	for _, p := range stale {
		plant(t, p, gone)
	}
	// Another daemon's write in progress (a rolling update): kept.
	inProgress := filepath.Join(e.cdiDir, ".rdma.dra.dev_metadata_uid-other_hca.json.42.tmp")
	plant(t, inProgress, young)
	// Another vendor's files: never ours to touch.
	foreign := filepath.Join(e.cdiDir, ".gpu.example.com_metadata_uid-x_gpu.json.1.tmp")
	plant(t, foreign, gone)

	e.start()
	after := e.metadataAt(inContainer, ids...)
	if after.UID != c.UID || !equalJSON(t, after.Requests, before.Requests) {
		t.Errorf("metadata after the reboot:\n%+v\nbefore:\n%+v", after, before)
	}
	for _, p := range stale {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived the start (%v)", p, err)
		}
	}
	for _, p := range []string{inProgress, foreign} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}

	// A kill in the claim's last write left a temp file: unprepare takes it too.
	plant(t, filepath.Join(e.cdiDir, ".rdma.dra.dev_metadata_uid-made-for-pod_hca.json.77.tmp"), young)
	plant(t, filepath.Join(filepath.Dir(mdFile), ".metadata.json.78.tmp"), young)
	if r := e.unprepare(ref(c))[string(c.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	want := []string{filepath.Base(foreign), filepath.Base(inProgress)}
	if got := files(t, e.cdiDir); !slices.Equal(got, want) {
		t.Errorf("CDI dir after unprepare: %v, want only %v", got, want)
	}
	if got := files(t, filepath.Join(e.pluginDir, "dra-device-metadata")); len(got) != 0 {
		t.Errorf("metadata dir after unprepare: %v", got)
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	x, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

// TestPodClaimNameChecked: the pod-claim-name annotation becomes a path in
// the container, and whoever creates a claim can set it: one that is not a
// pod claim name (a DNS label) is refused, naming the annotation, and
// leaves no file behind; a good one, on another claim, is prepared.
func TestPodClaimNameChecked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.cfg.DeviceMetadata = true
	e.start()
	for i, name := range []string{"../../../../etc", "rdma/x", "Upper", strings.Repeat("a", 64)} {
		c := e.claim(fmt.Sprintf("odd-%d", i), hostNetworkPod(fmt.Sprintf("p%d", i), true), one("mlx5-8"))
		c.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: name}
		if _, err := e.client.ResourceV1().ResourceClaims("default").Update(context.Background(), c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		r := e.prepare(c)[string(c.UID)]
		want := fmt.Sprintf("annotation %s=%q is not a pod claim name", resourceapi.PodResourceClaimAnnotation, name)
		if !strings.Contains(r.Error, want) {
			t.Errorf("pod claim name %q: prepare error %q, want %q", name, r.Error, want)
		}
		if got := files(t, e.cdiDir); len(got) != 0 {
			t.Errorf("pod claim name %q: CDI files left: %v", name, got)
		}
	}
	c := e.claim("good", hostNetworkPod("pg", true), one("mlx5-8"))
	c.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: "rdma-0"}
	if _, err := e.client.ResourceV1().ResourceClaims("default").Update(context.Background(), c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.mustPrepare(c)
}
