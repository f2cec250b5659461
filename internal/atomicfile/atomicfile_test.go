package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/internal/dirtest"
)

func TestWrite(t *testing.T) {
	tests := []struct {
		name     string
		old      []byte // the file before Write; nil: none
		oldMode  os.FileMode
		data     []byte
		opts     []Option
		wantMode os.FileMode
	}{
		{name: "new file, default mode", data: []byte("hello\n"), wantMode: 0o600},
		{name: "new file, WithMode", data: []byte("{}\n"), opts: []Option{WithMode(0o644)}, wantMode: 0o644},
		{name: "WithMode keeps only permission bits", data: []byte("x"), opts: []Option{WithMode(fs.ModeDir | 0o640)}, wantMode: 0o640},
		{name: "replaces a file, whose mode is not kept", old: []byte("old content, longer than the new"), oldMode: 0o644, data: []byte("new"), wantMode: 0o600},
		{name: "replaces a file with WithMode", old: []byte("old"), oldMode: 0o600, data: []byte("new"), opts: []Option{WithMode(0o444)}, wantMode: 0o444},
		{name: "empty data", old: []byte("old"), oldMode: 0o644, data: []byte{}, wantMode: 0o600},
		{name: "WithoutSync", old: []byte("old"), oldMode: 0o644, data: []byte("new"), opts: []Option{WithoutSync()}, wantMode: 0o600},
		{name: "WithTempPattern", data: []byte("new"), opts: []Option{WithTempPattern(".f.*.tmp")}, wantMode: 0o600},
		{name: "WithValidate accepting", data: []byte("new"), opts: []Option{WithValidate(func(string) error { return nil })}, wantMode: 0o600},
		{name: "nil options are ignored", data: []byte("new"), opts: []Option{nil, WithValidate(nil)}, wantMode: 0o600},
		{name: "large data", data: bytes.Repeat([]byte("0123456789abcdef"), 1<<16), wantMode: 0o600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			if tt.old != nil {
				if err := os.WriteFile(path, tt.old, tt.oldMode); err != nil {
					t.Fatal(err)
				}
			}
			if err := Write(path, tt.data, tt.opts...); err != nil {
				t.Fatalf("Write: %v", err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tt.data) {
				t.Errorf("content %q, want %q", shorten(got), shorten(tt.data))
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode() != tt.wantMode {
				t.Errorf("mode %v, want %v", fi.Mode(), tt.wantMode)
			}
			if names := dirtest.Names(t, dir); !reflect.DeepEqual(names, []string{"f"}) {
				t.Errorf("left in the directory: %q, want only the file", names)
			}
		})
	}
}

// TestWriteWithoutSyncOverNonFiles: an unsynced write swaps names only
// with a regular file; a symlink is replaced itself (its target is left
// alone) and a directory is refused, as a rename would.
func TestWriteWithoutSyncOverNonFiles(t *testing.T) {
	tests := []struct {
		name    string
		make    func(t *testing.T, dir, path string)
		wantErr bool
		want    []string // the directory after
	}{
		{name: "symlink", make: func(t *testing.T, dir, path string) {
			if err := os.WriteFile(filepath.Join(dir, "target"), []byte("target"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("target", path); err != nil {
				t.Fatal(err)
			}
		}, want: []string{"f", "target"}},
		{name: "directory", make: func(t *testing.T, _, path string) {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}, wantErr: true, want: []string{"f"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			tt.make(t, dir, path)
			err := Write(path, []byte("new"), WithoutSync())
			if (err != nil) != tt.wantErr {
				t.Fatalf("Write: %v, want an error: %v", err, tt.wantErr)
			}
			if names := dirtest.Names(t, dir); !reflect.DeepEqual(names, tt.want) {
				t.Errorf("left in the directory: %q, want %q", names, tt.want)
			}
			if tt.wantErr {
				return
			}
			if fi, err := os.Lstat(path); err != nil || !fi.Mode().IsRegular() {
				t.Errorf("%s is not a regular file after the write: %v %v", path, fi, err)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "target")); string(b) != "target" {
				t.Errorf("the symlink's target now holds %q; it must be left alone", b)
			}
		})
	}
}

// TestWriteRelativePath: a path without a directory is written in the
// working directory, not in os.TempDir.
func TestWriteRelativePath(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := Write("f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile("f"); err != nil || string(b) != "x" {
		t.Errorf("f = %q, %v", b, err)
	}
	if names := dirtest.Names(t, "."); !reflect.DeepEqual(names, []string{"f"}) {
		t.Errorf("left in the directory: %q", names)
	}
}

// TestWriteValidateSeesTheFinalFile: the validator gets the complete temp
// file, with its mode, beside the target, while the target is still old.
func TestWriteValidateSeesTheFinalFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "spec.json")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	calls := 0
	validate := func(tmp string) error {
		calls++
		if filepath.Dir(tmp) != dir || !strings.HasPrefix(filepath.Base(tmp), ".spec.json.") || !strings.HasSuffix(tmp, ".tmp") {
			t.Errorf("temp path %s, want .spec.json.*.tmp in %s", tmp, dir)
		}
		if b, err := os.ReadFile(tmp); err != nil || string(b) != "new" {
			t.Errorf("temp file = %q, %v; want the new content", b, err)
		}
		if fi, err := os.Stat(tmp); err != nil || fi.Mode() != 0o644 {
			t.Errorf("temp file mode = %v, %v; want 0644", fi.Mode(), err)
		}
		if b, _ := os.ReadFile(path); string(b) != "old" {
			t.Errorf("target already %q during validation", b)
		}
		return nil
	}
	if err := Write(path, []byte("new"), WithMode(0o644), WithTempPattern(".spec.json.*.tmp"), WithValidate(validate)); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("validate called %d times, want 1", calls)
	}
}

func TestWriteFailure(t *testing.T) {
	errInvalid := errors.New("invalid spec")
	tests := []struct {
		name string
		// setup prepares dir and returns the path to write to.
		setup func(t *testing.T, dir string) string
		opts  []Option
		// wantIs is an error that the result must wrap; wantMsg text it
		// must contain. Either may be unset.
		wantIs  error
		wantMsg string
	}{
		{
			name:    "validate fails",
			setup:   func(t *testing.T, dir string) string { return writeOld(t, dir, "f") },
			opts:    []Option{WithValidate(func(string) error { return errInvalid })},
			wantIs:  errInvalid,
			wantMsg: "invalid spec",
		},
		{
			name:   "validate fails on a new file",
			setup:  func(t *testing.T, dir string) string { return filepath.Join(dir, "f") },
			opts:   []Option{WithMode(0o644), WithTempPattern(".f.*.tmp"), WithValidate(func(string) error { return errInvalid })},
			wantIs: errInvalid,
		},
		{
			name:   "missing directory",
			setup:  func(t *testing.T, dir string) string { return filepath.Join(dir, "missing", "f") },
			wantIs: fs.ErrNotExist,
		},
		{
			// Fails for root too, unlike a read-only directory.
			name: "parent is a regular file",
			setup: func(t *testing.T, dir string) string {
				return filepath.Join(writeOld(t, dir, "plugins"), "f")
			},
			wantIs: syscall.ENOTDIR,
		},
		{
			name: "read-only directory",
			setup: func(t *testing.T, dir string) string {
				if os.Geteuid() == 0 {
					t.Skip("skipped: root ignores directory permissions; \"parent is a regular file\" covers a failed create")
				}
				path := writeOld(t, dir, "f")
				if err := os.Chmod(dir, 0o555); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = os.Chmod(dir, 0o755) })
				return path
			},
			wantIs: fs.ErrPermission,
		},
		{
			// The temp name is longer than the target's.
			name:    "temp file name too long",
			setup:   func(t *testing.T, dir string) string { return writeOld(t, dir, strings.Repeat("c", 250)) },
			wantMsg: "file name too long",
		},
		{
			// The temp file is written, then the rename fails: the temp
			// file must be removed.
			name: "rename onto a directory",
			setup: func(t *testing.T, dir string) string {
				path := filepath.Join(dir, "f")
				writeOld(t, path, "keep")
				return path
			},
			wantMsg: "file exists",
		},
		{
			name:    "temp pattern with a separator",
			setup:   func(t *testing.T, dir string) string { return writeOld(t, dir, "f") },
			opts:    []Option{WithTempPattern("sub/.f.*")},
			wantMsg: "pattern contains path separator",
		},
		{
			name:    "empty path",
			setup:   func(t *testing.T, dir string) string { return "" },
			wantMsg: "not a file path",
		},
		{
			name:    "path ending in a slash",
			setup:   func(t *testing.T, dir string) string { return dir + "/" },
			wantMsg: "not a file path",
		},
		{
			name:    "path ending in ..",
			setup:   func(t *testing.T, dir string) string { return filepath.Join(dir, "a") + "/.." },
			wantMsg: "not a file path",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tt.setup(t, dir)
			before := snapshot(t, dir)
			err := Write(path, []byte("new content"), tt.opts...)
			if err == nil {
				t.Fatal("Write succeeded")
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name %q", err, path)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error %q does not wrap %v", err, tt.wantIs)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
			if after := snapshot(t, dir); !reflect.DeepEqual(after, before) {
				t.Errorf("a failed Write changed the directory:\nbefore %q\nafter  %q", before, after)
			}
		})
	}
}

// TestWriteConcurrent: writers racing on one path, watched by readers,
// never show a torn or empty file, and the last rename's content stays.
func TestWriteConcurrent(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
	}{
		{"sync", nil},
		{"WithoutSync", []Option{WithoutSync()}},
	}
	const (
		writers = 8
		rounds  = 20
		size    = 64 << 10
	)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			contents := make([][]byte, writers)
			for i := range contents {
				contents[i] = bytes.Repeat([]byte{byte('a' + i)}, size)
			}
			if err := Write(path, contents[0], tt.opts...); err != nil {
				t.Fatal(err)
			}
			var writing, reading sync.WaitGroup
			done := make(chan struct{})
			for range 2 {
				reading.Go(func() {
					for {
						select {
						case <-done:
							return
						default:
						}
						b, err := os.ReadFile(path)
						if err != nil {
							t.Errorf("reading during writes: %v", err)
							return
						}
						if !whole(b, contents) {
							t.Errorf("a reader saw a torn file: %d bytes, starting %q", len(b), shorten(b))
							return
						}
					}
				})
			}
			for i := range writers {
				writing.Go(func() {
					for range rounds {
						if err := Write(path, contents[i], tt.opts...); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			writing.Wait()
			close(done)
			reading.Wait()
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !whole(b, contents) {
				t.Errorf("the file ended torn: %d bytes, starting %q", len(b), shorten(b))
			}
			if names := dirtest.Names(t, dir); !reflect.DeepEqual(names, []string{"f"}) {
				t.Errorf("left in the directory: %q, want only the file", names)
			}
		})
	}
}

func TestSyncDir(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		dir     string
		wantErr error
	}{
		{"directory", dir, nil},
		{"missing", filepath.Join(dir, "missing"), fs.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := SyncDir(tt.dir)
			if tt.wantErr == nil {
				if err != nil {
					t.Errorf("SyncDir: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) || !strings.Contains(fmt.Sprint(err), tt.dir) {
				t.Errorf("SyncDir error %v, want one wrapping %v and naming %s", err, tt.wantErr, tt.dir)
			}
		})
	}
}

func BenchmarkWrite(b *testing.B) {
	modes := []struct {
		name string
		opts []Option
	}{
		{"sync", nil},
		{"nosync-unsafe", []Option{WithoutSync()}},
	}
	for _, mode := range modes {
		for _, size := range []int{4 << 10, 256 << 10} {
			b.Run(fmt.Sprintf("%s/size=%dKiB", mode.name, size>>10), func(b *testing.B) {
				path := filepath.Join(b.TempDir(), "f")
				data := bytes.Repeat([]byte{'x'}, size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					if err := Write(path, data, mode.opts...); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// whole reports whether b is exactly one of contents.
func whole(b []byte, contents [][]byte) bool {
	for _, c := range contents {
		if bytes.Equal(b, c) {
			return true
		}
	}
	return false
}

// writeOld writes "old" to dir/name (making dir if needed) and returns the
// path.
func writeOld(t *testing.T, dir, name string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// snapshot maps every file under dir to its mode and contents.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		files[p] = fi.Mode().String() + " " + string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func shorten(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}
