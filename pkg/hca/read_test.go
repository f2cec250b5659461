package hca

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestReadSysfs(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, content string
	}{
		{"empty", ""}, {"attribute", "4: ACTIVE\n"}, {"exactly the buffer", strings.Repeat("x", 512)},
		{"longer than the buffer", strings.Repeat("0123456789", 300)},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_"))
		if err := os.WriteFile(path, []byte(tt.content), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := readSysfs(path)
		if err != nil || string(got) != tt.content {
			t.Errorf("%s: got %d bytes (%v), want %d", tt.name, len(got), err, len(tt.content))
		}
	}
	if _, err := readSysfs(filepath.Join(dir, "nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
	var pe *fs.PathError
	if _, err := readSysfs(dir); !errors.As(err, &pe) || pe.Path != dir || !errors.Is(err, syscall.EISDIR) {
		t.Errorf("a directory: %v, want a PathError naming it (EISDIR)", err)
	}
}
