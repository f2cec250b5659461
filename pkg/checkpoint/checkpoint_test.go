package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdma-dra/rdma-dra-driver/internal/dirtest"
)

var update = flag.Bool("update", false, "rewrite testdata/checkpoint-v1.golden.json and testdata/moved-hca.golden.json")

var preparedAt = time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.UTC)

// sample is a checkpoint with every field set somewhere.
func sample() Checkpoint {
	return Checkpoint{Claims: map[string]Claim{
		"b-uid": {
			UID: "b-uid", Namespace: "training", Name: "job-rdma",
			PodUIDs: []string{"pod-1", "pod-2"},
			Devices: []Device{
				{Request: "rdma", Pool: "node-a", Device: "mlx5-0", IBDev: "mlx5_0", Env: true, ManagementDevices: true,
					CDIDeviceIDs: []string{"rdma.dra.dev/hca=b-uid-mlx5-0"}},
				{Request: "rdma/ib", Pool: "node-a", Device: "mlx5-1", IBDev: "mlx5_1", ShareID: "share-1",
					CDIDeviceIDs: []string{"rdma.dra.dev/hca=b-uid-mlx5-1-share-1"}},
			},
			BootID:     "5b1f0a3c-8f0e-4c55-9d8e-0c1f2a3b4c5d",
			PreparedAt: preparedAt,
		},
		"a-uid": {
			UID: "a-uid", Namespace: "monitoring", Name: "probe <&>",
			Devices:    []Device{{Request: "hca", Pool: "node-a", Device: "mlx5-0", IBDev: "mlx5_0", AdminAccess: true}},
			BootID:     "5b1f0a3c-8f0e-4c55-9d8e-0c1f2a3b4c5d",
			PreparedAt: preparedAt.Add(time.Second),
		},
	}}
}

func empty() Checkpoint { return Checkpoint{Claims: map[string]Claim{}} }

func newStore(t testing.TB) *Store {
	t.Helper()
	return NewStore(filepath.Join(t.TempDir(), "checkpoint.json"))
}

func mustLoad(t testing.TB, s *Store) Checkpoint {
	t.Helper()
	cp, err := s.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return cp
}

func assertEqual(t testing.TB, got, want Checkpoint) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", " ")
		w, _ := json.MarshalIndent(want, "", " ")
		t.Fatalf("got checkpoint\n%s\nwant\n%s", g, w)
	}
}

func TestRoundTrip(t *testing.T) {
	local := time.FixedZone("CET", 3600)
	tests := []struct {
		name string
		in   Checkpoint
		want Checkpoint
	}{
		{"empty", empty(), empty()},
		{"nil map", Checkpoint{}, empty()},
		{"claims", sample(), sample()},
		{
			name: "times are kept in UTC",
			in:   Checkpoint{Claims: map[string]Claim{"u": {UID: "u", PreparedAt: preparedAt.In(local)}}},
			want: Checkpoint{Claims: map[string]Claim{"u": {UID: "u", PreparedAt: preparedAt}}},
		},
		{
			name: "monotonic reading is dropped",
			in:   Checkpoint{Claims: map[string]Claim{"u": {UID: "u", PreparedAt: time.Now()}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			if err := s.Save(tt.in); err != nil {
				t.Fatalf("Save: %v", err)
			}
			fromMemory := mustLoad(t, s)
			fromDisk := mustLoad(t, NewStore(s.Path()))
			if tt.want.Claims == nil { // whatever it is, both must agree
				tt.want = fromDisk
			}
			assertEqual(t, fromDisk, tt.want)
			assertEqual(t, fromMemory, tt.want)
			if names := dirtest.Names(t, filepath.Dir(s.Path())); !reflect.DeepEqual(names, []string{"checkpoint.json"}) {
				t.Errorf("directory after Save holds %q, want only checkpoint.json", names)
			}
		})
	}
}

// TestGoldenFile pins what Save writes for a checkpoint with every field
// set. The file is also the input of testdata/history/generate.sh.
func TestGoldenFile(t *testing.T) {
	s := newStore(t)
	if err := s.Save(full()); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "checkpoint-v1.golden.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestGoldenFile -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Save wrote\n%s\nbut %s holds\n%s\nA format change must stay readable by older releases (see the package doc); if it does, run go test -run TestGoldenFile -update", got, golden, want)
	}
	assertEqual(t, mustLoad(t, NewStore(golden)), full())
	st, _ := os.Stat(s.Path())
	if perm := st.Mode().Perm(); perm != 0o600 {
		t.Errorf("checkpoint mode = %v, want 0600", perm)
	}
}

func TestLoadMissingFile(t *testing.T) {
	s := newStore(t)
	assertEqual(t, mustLoad(t, s), empty())
	if _, err := os.Stat(s.Path()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load created the file: %v", err)
	}
}

func TestLoadReturnsACopy(t *testing.T) {
	s := newStore(t)
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	cp := mustLoad(t, s)
	cp.Claims["b-uid"].Devices[0].CDIDeviceIDs[0] = "changed"
	cp.Claims["b-uid"].PodUIDs[0] = "changed"
	delete(cp.Claims, "a-uid")
	assertEqual(t, mustLoad(t, s), sample())
}

func TestSaveRejectsAClaimUnderAnotherKey(t *testing.T) {
	tests := []struct {
		name string
		cp   Checkpoint
		want string
	}{
		{"other UID", Checkpoint{Claims: map[string]Claim{"a": {UID: "b", Namespace: "ns", Name: "c"}}}, `claim ns/c is under key "a" but has UID "b"`},
		{"no UID", Checkpoint{Claims: map[string]Claim{"a": {Namespace: "ns", Name: "c"}}}, `under key "a" but has UID ""`},
		{"empty key", Checkpoint{Claims: map[string]Claim{"": {}}}, `under key ""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			err := s.Save(tt.cp)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), s.Path()) {
				t.Fatalf("Save = %v, want an error naming %s and containing %q", err, s.Path(), tt.want)
			}
			if _, err := os.Stat(s.Path()); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a rejected Save wrote the file: %v", err)
			}
		})
	}
}

// TestSaveFailureKeepsTheOldFile makes real writes fail at each step Save
// takes and checks that the old file and the directory are as before.
func TestSaveFailureKeepsTheOldFile(t *testing.T) {
	tests := []struct {
		name string
		// setup prepares dir and returns the checkpoint path to save to.
		setup func(t *testing.T, dir string) string
		want  string
	}{
		{
			name: "read-only directory",
			setup: func(t *testing.T, dir string) string {
				if os.Geteuid() == 0 {
					t.Skip("skipped: running as root, which ignores directory permissions (the other cases cover the failure)")
				}
				path := writeOld(t, dir, "checkpoint.json")
				if err := os.Chmod(dir, 0o555); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = os.Chmod(dir, 0o755) })
				return path
			},
			want: "permission denied",
		},
		{
			name:  "missing directory",
			setup: func(t *testing.T, dir string) string { return filepath.Join(dir, "missing", "checkpoint.json") },
			want:  "no such file or directory",
		},
		{
			name: "parent is a file",
			setup: func(t *testing.T, dir string) string {
				writeOld(t, dir, "plugins")
				return filepath.Join(dir, "plugins", "checkpoint.json")
			},
			want: "not a directory",
		},
		{
			// The temp name is longer than the file's: creating it fails
			// even for root, with the old file in place.
			name:  "temp file name too long",
			setup: func(t *testing.T, dir string) string { return writeOld(t, dir, strings.Repeat("c", 245)) },
			want:  "file name too long",
		},
		{
			// The temp file is written, then the rename fails: it must
			// be removed.
			name: "rename onto a directory",
			setup: func(t *testing.T, dir string) string {
				path := filepath.Join(dir, "checkpoint.json")
				writeOld(t, path, "keep")
				return path
			},
			want: "file exists",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tt.setup(t, dir)
			before := snapshot(t, dir)
			s := NewStore(path)
			err := s.Save(sample())
			if err == nil {
				t.Fatal("Save succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("Save error = %q, want it to name %s and say %q", err, path, tt.want)
			}
			if after := snapshot(t, dir); !reflect.DeepEqual(after, before) {
				t.Errorf("a failed Save changed the directory:\nbefore %q\nafter  %q", before, after)
			}
		})
	}
}

// writeOld writes a valid old checkpoint named name in dir (making dir if
// needed) and returns its path.
func writeOld(t *testing.T, dir, name string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, oldFile, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

var oldFile = encodeFile([]byte(`{"claims":{"old":{"uid":"old"}}}`))

// snapshot maps every file under dir to its contents.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		files[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestRemoveStaleTemps: under the file lock, which every write holds while
// its temp file exists, the temp files of writes that never finished go,
// young or old; other files' stay.
func TestRemoveStaleTemps(t *testing.T) {
	s := newStore(t)
	dir := filepath.Dir(s.Path())
	now := time.Now()
	stale := filepath.Join(dir, ".checkpoint.json.tmp-123456")
	young := filepath.Join(dir, ".checkpoint.json.tmp-654321")
	other := filepath.Join(dir, ".other.json.tmp-123456")
	for p, age := range map[string]time.Duration{stale: time.Minute, young: time.Second, other: time.Hour} {
		if err := os.WriteFile(p, []byte(`{"version": 1, "chec`), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := s.RemoveStaleTemps(now.Add(-10 * time.Second))
	slices.Sort(removed)
	if want := []string{filepath.Base(stale), filepath.Base(young)}; err != nil || !slices.Equal(removed, want) {
		t.Errorf("removed %v (%v), want %v", removed, err, want)
	}
	for _, p := range []string{stale, young} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the killed write's temp file %s is still there: %v", p, err)
		}
	}
	for _, p := range []string{other} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("removed %s: %v", p, err)
		}
	}
	mustLoad(t, s)
}

func TestLoadCorrupt(t *testing.T) {
	valid := encodeFile(mustEncode(t, sample()))
	tests := []struct {
		name string
		file []byte
		want string
	}{
		{"garbage", []byte("\x00\x01\x02 not json"), "not a JSON object"},
		{"truncated", valid[:len(valid)/2], "unexpected end of JSON input"},
		{"truncated to the envelope", valid[:40], "not a JSON object (truncated?)"},
		{"empty", []byte{}, "the file is empty"},
		{"blank", []byte("\n\n"), "the file is empty"},
		{"null", []byte("null"), "not a JSON object, but null"},
		{"array", []byte(`[{"version":1}]`), "not a JSON object"},
		{"trailing data", append(bytes.Clone(valid), "{}"...), "not a JSON object"},
		{"checksum mismatch", bytes.Replace(valid, []byte("mlx5_1"), []byte("mlx5_7"), 1), "checksum mismatch: the file records"},
		{"checksum missing", []byte(`{"version":1,"data":{"claims":{}}}`), `"checksum" is missing`},
		{"checksum not a string", []byte(`{"version":1,"checksum":12,"data":{"claims":{}}}`), `"checksum" is missing or not a string`},
		{"data missing", []byte(`{"version":1,"checksum":"ab"}`), `"data" is missing`},
		{"version a string", []byte(`{"version":"1","checksum":"ab","data":{}}`), `"version" is "1", want an integer`},
		{"version zero", []byte(`{"version":0,"checksum":"ab","data":{}}`), `"version" is 0`},
		{"version negative", []byte(`{"version":-3,"checksum":"ab","data":{}}`), `"version" is -3`},
		{"no version", []byte(`{"checksum":"ab","data":{}}`), `"checksum" but no "version"`},
		{"data of the wrong type", encodeFile([]byte(`{"claims":[1,2]}`)), "data does not decode"},
		{"claim under another UID", encodeFile([]byte(`{"claims":{"a":{"uid":"b"}}}`)), `the claim under key "a" has UID "b"`},
		{"version 0 of the wrong type", []byte(`{"u":{"Devices":"mlx5_0"}}`), "version 0 (no envelope)"},
		{"claim under an empty key", encodeFile([]byte(`{"claims":{"":{"name":"c"}}}`)), "claim /c is under an empty key"},
		{"version 0 claim under another UID", []byte(`{"a":{"UID":"b"}}`), `the claim under key "a" has UID "b"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "checkpoint.json")
			if err := os.WriteFile(path, tt.file, 0o600); err != nil {
				t.Fatal(err)
			}
			s := NewStore(path)
			s.now = func() time.Time { return time.Date(2026, 7, 1, 12, 30, 45, 0, time.FixedZone("X", 7200)) }

			_, err := s.Load()
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Load = %v, want ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load error = %q, want it to name %s and say %q", err, path, tt.want)
			}
			if err := s.Update(func(*Checkpoint) error { return nil }); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Update on a corrupt file = %v, want ErrCorrupt", err)
			}

			moved, err := s.Quarantine()
			if err != nil {
				t.Fatalf("Quarantine: %v", err)
			}
			if want := path + ".corrupt-20260701T103045Z"; moved != want {
				t.Errorf("Quarantine moved the file to %s, want %s", moved, want)
			}
			if b, err := os.ReadFile(moved); err != nil || !bytes.Equal(b, tt.file) {
				t.Errorf("the quarantined file does not hold the original bytes: %v", err)
			}
			assertEqual(t, mustLoad(t, s), empty())
			assertEqual(t, mustLoad(t, NewStore(path)), empty())
			if err := s.Save(sample()); err != nil {
				t.Fatalf("Save after Quarantine: %v", err)
			}
			assertEqual(t, mustLoad(t, NewStore(path)), sample())
		})
	}
}

func mustEncode(t testing.TB, cp Checkpoint) []byte {
	t.Helper()
	b, err := encodeData(cp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestQuarantineNeverOverwrites(t *testing.T) {
	s := newStore(t)
	s.now = func() time.Time { return time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC) }
	var moved []string
	for i := range 3 {
		if err := os.WriteFile(s.Path(), []byte(fmt.Sprintf("garbage %d", i)), 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := s.Quarantine()
		if err != nil {
			t.Fatal(err)
		}
		moved = append(moved, m)
	}
	base := s.Path() + ".corrupt-20260701T000000Z"
	if want := []string{base, base + ".1", base + ".2"}; !reflect.DeepEqual(moved, want) {
		t.Fatalf("Quarantine moved files to %q, want %q", moved, want)
	}
	for i, m := range moved {
		if b, _ := os.ReadFile(m); string(b) != fmt.Sprintf("garbage %d", i) {
			t.Errorf("%s holds %q, want garbage %d", m, b, i)
		}
	}
}

func TestQuarantineMissingFile(t *testing.T) {
	s := newStore(t)
	if _, err := s.Quarantine(); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), s.Path()) {
		t.Fatalf("Quarantine of a missing file = %v, want a not-exist error naming the file", err)
	}
}

func TestLoadOtherReleases(t *testing.T) {
	tests := []struct {
		file string
		want Checkpoint
	}{
		{
			file: "checkpoint-v0.json",
			want: Checkpoint{Claims: map[string]Claim{
				"0f4a2c1e-6b7d-4e8f-9a0b-1c2d3e4f5a6b": {
					UID: "0f4a2c1e-6b7d-4e8f-9a0b-1c2d3e4f5a6b", Namespace: "training", Name: "job-0-rdma",
					Devices: []Device{{Request: "rdma", Pool: "node-a", Device: "mlx5-0", IBDev: "mlx5_0", Env: true,
						CDIDeviceIDs: []string{"rdma.dra.dev/hca=0f4a2c1e-6b7d-4e8f-9a0b-1c2d3e4f5a6b-mlx5-0"}}},
					PreparedAt: time.Date(2025, 11, 3, 9, 12, 44, 123456789, time.UTC),
				},
				// The prototype left this UID to the key.
				"7c9e1b2a-3d4f-4a5b-8c6d-7e8f9a0b1c2d": {
					UID: "7c9e1b2a-3d4f-4a5b-8c6d-7e8f9a0b1c2d", Namespace: "monitoring", Name: "fabric-probe",
					Devices: []Device{{Request: "hca", Pool: "node-a", Device: "mlx5-1", IBDev: "mlx5_1", AdminAccess: true, Env: true,
						CDIDeviceIDs: []string{"rdma.dra.dev/hca=7c9e1b2a-3d4f-4a5b-8c6d-7e8f9a0b1c2d-mlx5-1"}}},
					PreparedAt: time.Date(2025, 11, 3, 9, 13, 2, 0, time.UTC),
				},
			}},
		},
		{
			// Written before PodUIDs and BootID existed: they load empty.
			file: "checkpoint-v1-older-release.json",
			want: Checkpoint{Claims: map[string]Claim{
				"3b5d7f9a-1c2e-4a6b-8d0f-2e4a6c8e0a1b": {
					UID: "3b5d7f9a-1c2e-4a6b-8d0f-2e4a6c8e0a1b", Namespace: "training", Name: "job-1-rdma",
					Devices: []Device{{Request: "rdma", Pool: "node-a", Device: "mlx5-2", IBDev: "mlx5_2", Env: true,
						CDIDeviceIDs: []string{"rdma.dra.dev/hca=3b5d7f9a-1c2e-4a6b-8d0f-2e4a6c8e0a1b-mlx5-2"}}},
					PreparedAt: time.Date(2026, 1, 15, 17, 40, 5, 0, time.UTC),
				},
			}},
		},
		{
			// Unknown fields in the envelope, the data, a claim and a device.
			file: "checkpoint-v1-newer-release.json",
			want: Checkpoint{Claims: map[string]Claim{
				"9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a": {
					UID: "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a", Namespace: "inference", Name: "server-rdma",
					PodUIDs: []string{"aa11bb22-cc33-4d44-8e55-ff6677889900"},
					Devices: []Device{{Request: "rdma/ib", Pool: "node-b", Device: "mlx5-3", IBDev: "mlx5_3",
						ShareID: "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b", Env: true,
						CDIDeviceIDs: []string{"rdma.dra.dev/hca=9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a-mlx5-3-5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b"}}},
					BootID:     "1e2d3c4b-5a69-4788-9a6b-5c4d3e2f1a0b",
					PreparedAt: time.Date(2026, 4, 2, 8, 0, 0, 500000000, time.UTC),
				},
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			orig, err := os.ReadFile(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "checkpoint.json")
			if err := os.WriteFile(path, orig, 0o600); err != nil {
				t.Fatal(err)
			}
			s := NewStore(path)
			assertEqual(t, mustLoad(t, s), tt.want)

			// The next change writes the current format, which reads the same.
			err = s.Update(func(cp *Checkpoint) error {
				c := cp.Claims[firstKey(cp.Claims)]
				c.Name += "-renamed"
				cp.Claims[c.UID] = c
				return nil
			})
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(got, []byte("{\n  \"version\": 1,\n  \"checksum\": ")) {
				t.Errorf("the rewritten file is not in the current format:\n%s", got)
			}
			reread := mustLoad(t, NewStore(path))
			for uid, c := range reread.Claims {
				if strings.HasSuffix(c.Name, "-renamed") {
					c.Name = strings.TrimSuffix(c.Name, "-renamed")
					reread.Claims[uid] = c
				}
			}
			assertEqual(t, reread, tt.want)
		})
	}
}

func firstKey(m map[string]Claim) string {
	for k := range m {
		return k
	}
	return ""
}

func TestLoadTooNewVersion(t *testing.T) {
	orig, err := os.ReadFile(filepath.Join("testdata", "checkpoint-v2.json"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	s := NewStore(path)
	_, err = s.Load()
	if err == nil {
		t.Fatal("Load of a version 2 file succeeded")
	}
	if errors.Is(err, ErrCorrupt) {
		t.Errorf("Load of a newer version says ErrCorrupt, which would make the driver discard it: %v", err)
	}
	for _, want := range []string{path, "format version 2", "versions up to 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Load error = %q, want it to contain %q", err, want)
		}
	}
	if err := s.Update(func(cp *Checkpoint) error { cp.Claims["x"] = Claim{UID: "x"}; return nil }); err == nil {
		t.Error("Update over a version 2 file succeeded")
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, orig) {
		t.Errorf("the version 2 file was changed:\n%s", got)
	}
}

func TestUpdate(t *testing.T) {
	errFn := errors.New("claim is not allocated")
	tests := []struct {
		name      string
		fn        func(*Checkpoint) error
		wantErr   error
		want      Checkpoint
		wantWrite bool
	}{
		{
			name: "add",
			fn: func(cp *Checkpoint) error {
				cp.Claims["c-uid"] = Claim{UID: "c-uid", Name: "new", PreparedAt: preparedAt}
				return nil
			},
			want:      withClaim(sample(), Claim{UID: "c-uid", Name: "new", PreparedAt: preparedAt}),
			wantWrite: true,
		},
		{
			name:      "delete",
			fn:        func(cp *Checkpoint) error { delete(cp.Claims, "a-uid"); return nil },
			want:      withoutClaim(sample(), "a-uid"),
			wantWrite: true,
		},
		{
			name:      "change in place",
			fn:        func(cp *Checkpoint) error { cp.Claims["b-uid"].Devices[0].CDIDeviceIDs[0] = "x"; return nil },
			want:      withCDIID(sample(), "x"),
			wantWrite: true,
		},
		{
			name: "error changes nothing",
			fn: func(cp *Checkpoint) error {
				delete(cp.Claims, "a-uid")
				cp.Claims["b-uid"].PodUIDs[0] = "x"
				return errFn
			},
			wantErr: errFn,
			want:    sample(),
		},
		{
			name: "no change writes nothing",
			fn:   func(cp *Checkpoint) error { delete(cp.Claims, "unknown"); return nil },
			want: sample(),
		},
		{
			name:    "bad key is rejected",
			fn:      func(cp *Checkpoint) error { cp.Claims["z"] = Claim{UID: "y"}; return nil },
			wantErr: errAny,
			want:    sample(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			if err := s.Save(sample()); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Stat(s.Path())
			err := s.Update(tt.fn)
			switch {
			case tt.wantErr == errAny && err == nil, tt.wantErr != errAny && !errors.Is(err, tt.wantErr):
				t.Fatalf("Update = %v, want %v", err, tt.wantErr)
			}
			assertEqual(t, mustLoad(t, s), tt.want)
			assertEqual(t, mustLoad(t, NewStore(s.Path())), tt.want)
			after, _ := os.Stat(s.Path())
			if wrote := !os.SameFile(before, after); wrote != tt.wantWrite {
				t.Errorf("Update replaced the file: %v, want %v", wrote, tt.wantWrite)
			}
		})
	}
}

var errAny = errors.New("any error")

func withClaim(cp Checkpoint, c Claim) Checkpoint { cp.Claims[c.UID] = c; return cp }

func withoutClaim(cp Checkpoint, uid string) Checkpoint { delete(cp.Claims, uid); return cp }

func withCDIID(cp Checkpoint, id string) Checkpoint {
	cp.Claims["b-uid"].Devices[0].CDIDeviceIDs[0] = id
	return cp
}

// TestUpdateReadsAnUnchangedFileOnce: while the file is the one the Store
// last read or wrote (same inode, size and mtime), Update works from memory.
func TestUpdateReadsAnUnchangedFileOnce(t *testing.T) {
	s := newStore(t)
	if err := s.Update(func(cp *Checkpoint) error { cp.Claims["a"] = Claim{UID: "a"}; return nil }); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	// Same length, same mtime, in place: only a re-read would notice.
	if err := os.WriteFile(s.Path(), bytes.Repeat([]byte("x"), int(fi.Size())), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(s.Path(), fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(cp *Checkpoint) error { cp.Claims["b"] = Claim{UID: "b"}; return nil }); err != nil {
		t.Fatalf("Update re-read an unchanged file: %v", err)
	}
	if got := mustLoad(t, NewStore(s.Path())); len(got.Claims) != 2 {
		t.Fatalf("file holds %d claims, want 2", len(got.Claims))
	}
}

// TestTwoWriters: during a rolling update two daemons share the file. Each
// sees the other's writes, and neither loses the other's claims, even when
// they update at the same time.
func TestTwoWriters(t *testing.T) {
	a := newStore(t)
	b := NewStore(a.Path())
	add := func(s *Store, uid string) {
		t.Helper()
		if err := s.Update(func(cp *Checkpoint) error { cp.Claims[uid] = Claim{UID: uid}; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	add(a, "x")
	add(b, "y")
	add(a, "z")
	if got := mustLoad(t, a); len(got.Claims) != 3 || got.Claims["y"].UID != "y" {
		t.Fatalf("a sees %v, want x, y and z", slices.Sorted(maps.Keys(got.Claims)))
	}
	if err := b.Update(func(cp *Checkpoint) error { delete(cp.Claims, "x"); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, a); got.Claims["x"].UID != "" || len(got.Claims) != 2 {
		t.Fatalf("a still sees x after b removed it: %v", slices.Sorted(maps.Keys(got.Claims)))
	}

	var wg sync.WaitGroup
	for i := range 40 {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			uid := fmt.Sprintf("c%d", i)
			if err := s.Update(func(cp *Checkpoint) error { cp.Claims[uid] = Claim{UID: uid}; return nil }); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := mustLoad(t, NewStore(a.Path())); len(got.Claims) != 42 {
		t.Fatalf("after 40 concurrent updates through two Stores the file holds %d claims, want 42", len(got.Claims))
	}
}

func TestUpdateConcurrent(t *testing.T) {
	const goroutines, perGoroutine = 32, 8
	s := newStore(t)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perGoroutine {
				uid := fmt.Sprintf("claim-%d-%d", g, i)
				err := s.Update(func(cp *Checkpoint) error {
					cp.Claims[uid] = Claim{UID: uid, PodUIDs: []string{uid}}
					return nil
				})
				if err != nil {
					t.Error(err)
				}
				if _, err := s.Load(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	got := mustLoad(t, NewStore(s.Path()))
	if len(got.Claims) != goroutines*perGoroutine {
		t.Fatalf("the file holds %d claims, want %d", len(got.Claims), goroutines*perGoroutine)
	}
	for g := range goroutines {
		for i := range perGoroutine {
			if uid := fmt.Sprintf("claim-%d-%d", g, i); got.Claims[uid].UID != uid {
				t.Errorf("claim %s is missing", uid)
			}
		}
	}
	if names := dirtest.Names(t, filepath.Dir(s.Path())); len(names) != 1 {
		t.Errorf("directory holds %q, want only the checkpoint", names)
	}
}

func TestBootID(t *testing.T) {
	const id = "5b1f0a3c-8f0e-4c55-9d8e-0c1f2a3b4c5d"
	tests := []struct {
		name    string
		content *string // nil: no file
		want    string
		wantErr string
	}{
		{name: "as the kernel writes it", content: ptr(id + "\n"), want: id},
		{name: "no newline", content: ptr(id), want: id},
		{name: "empty", content: ptr(""), wantErr: `"" is not a boot ID`},
		{name: "not a UUID", content: ptr("5b1f0a3c_8f0e_4c55_9d8e_0c1f2a3b4c5d\n"), wantErr: "is not a boot ID"},
		{name: "two lines", content: ptr(id + "\n" + id + "\n"), wantErr: "is not a boot ID"},
		{name: "missing", wantErr: "no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "boot_id")
			if tt.content != nil {
				if err := os.WriteFile(path, []byte(*tt.content), 0o444); err != nil {
					t.Fatal(err)
				}
			}
			got, err := BootIDFrom(path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) {
					t.Fatalf("BootIDFrom = %q, %v; want an error naming %s and saying %q", got, err, path, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("BootIDFrom = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestBootIDOfThisMachine(t *testing.T) {
	if _, err := os.Stat(bootIDPath); err != nil {
		t.Skipf("skipped: %s is not readable here: %v", bootIDPath, err)
	}
	a, err := BootID()
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := BootID(); a != b {
		t.Fatalf("the boot ID changed within a boot: %q then %q", a, b)
	}
}

func TestBootTime(t *testing.T) {
	const stat = "cpu  1 2 3 4\nintr 5\nctxt 6\n"
	tests := []struct {
		name    string
		content *string // nil: no file
		want    time.Time
		wantErr string
	}{
		{name: "as the kernel writes it", content: ptr(stat + "btime 1782900000\nprocesses 7\n"), want: time.Unix(1782900000, 0)},
		{name: "last line, no newline", content: ptr(stat + "btime 1782900000"), want: time.Unix(1782900000, 0)},
		{name: "no btime", content: ptr(stat), wantErr: "no btime line"},
		{name: "not a number", content: ptr(stat + "btime soon\n"), wantErr: `"btime soon" is not a boot time`},
		{name: "zero", content: ptr(stat + "btime 0\n"), wantErr: "is not a boot time"},
		{name: "two values", content: ptr(stat + "btime 1782900000 1\n"), wantErr: "is not a boot time"},
		{name: "missing", wantErr: "no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "stat")
			if tt.content != nil {
				if err := os.WriteFile(path, []byte(*tt.content), 0o444); err != nil {
					t.Fatal(err)
				}
			}
			got, err := BootTimeFrom(path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) {
					t.Fatalf("BootTimeFrom = %v, %v; want an error naming %s and saying %q", got, err, path, tt.wantErr)
				}
				return
			}
			if err != nil || !got.Equal(tt.want) {
				t.Fatalf("BootTimeFrom = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestBootTimeOfThisMachine(t *testing.T) {
	if _, err := os.Stat(statPath); err != nil {
		t.Skipf("skipped: %s is not readable here: %v", statPath, err)
	}
	booted, err := BootTime()
	if err != nil {
		t.Fatal(err)
	}
	if now := time.Now(); !booted.Before(now) {
		t.Fatalf("booted at %v, not before now (%v)", booted, now)
	}
}

func ptr[T any](v T) *T { return &v }
