package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzDecodeFile feeds arbitrary bytes to the file decoder, both as a whole
// file and as the data of an envelope with a valid checksum (which random
// bytes never have). It must not panic; an error must be ErrCorrupt or the
// too-new version; an accepted checkpoint must be consistent and survive
// a write and read unchanged. The seeds are the testdata files.
func FuzzDecodeFile(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "*.json"))
	for _, p := range seeds {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"claims":{"u":{"uid":"u","preparedAt":"2026-01-01T00:00:00+02:00"}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, file := range [][]byte{b, encodeFile(b)} {
			cp, data, err := decodeFile("checkpoint.json", file)
			if err != nil {
				if cp.Claims != nil || data != nil {
					t.Fatalf("decodeFile(%q) returned data along with %v", file, err)
				}
				continue
			}
			for uid, c := range cp.Claims {
				if c.UID != uid {
					t.Fatalf("decodeFile(%q) accepted claim %q under key %q", file, c.UID, uid)
				}
			}
			if err := cp.normalize(); err != nil {
				t.Fatalf("decodeFile(%q) accepted a checkpoint Save rejects: %v", file, err)
			}
			enc, err := encodeData(cp)
			if err != nil {
				// Only a time whose UTC year is outside 0-9999.
				continue
			}
			again, _, err := decodeFile("checkpoint.json", encodeFile(enc))
			if err != nil {
				t.Fatalf("decodeFile(%q) accepted, but its rewrite fails: %v", file, err)
			}
			if !reflect.DeepEqual(cp, again) {
				t.Fatalf("decodeFile(%q) = %+v, but its rewrite reads as %+v", file, cp, again)
			}
		}
	})
}

// The decoder's errors are ErrCorrupt except for a newer version.
func TestDecodeErrorsAreCorruptOrTooNew(t *testing.T) {
	_, _, err := decodeFile("checkpoint.json", []byte(`{"version": 7}`))
	if err == nil || errors.Is(err, ErrCorrupt) {
		t.Fatalf("version 7: %v, want a too-new error that is not ErrCorrupt", err)
	}
}
