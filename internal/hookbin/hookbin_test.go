package hookbin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPinned(t *testing.T) {
	a, b := Pinned([]byte("hook v1")), Pinned([]byte("hook v2"))
	if a == b {
		t.Errorf("two binaries share the pinned name %s", a)
	}
	if a != Pinned([]byte("hook v1")) {
		t.Errorf("the pinned name of one binary changed between calls")
	}
	if !strings.HasPrefix(a, Name+"-") || len(a) != len(Name)+1+16 {
		t.Errorf("pinned name %q, want %s-<16 hex digits>", a, Name)
	}
}

func TestPinnedPath(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "image-hook")
	if err := os.WriteFile(src, []byte("hook v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, source, want, wantErr string
	}{
		{name: "beside the plain path", source: src, want: "/opt/rdma/bin/" + Pinned([]byte("hook v1"))},
		{name: "missing source", source: filepath.Join(dir, "absent"), wantErr: filepath.Join(dir, "absent")},
		{name: "empty source", source: empty, wantErr: empty + " is empty"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PinnedPath("/opt/rdma/bin/rdma-dra-hook", tt.source)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("PinnedPath = %q, %v; want an error naming %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("PinnedPath = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestIsPinned(t *testing.T) {
	for _, tt := range []struct {
		name string
		want bool
	}{
		{Pinned([]byte("hook v1")), true},
		{Name, false},
		{Name + "-0123456789abcdef", true},
		{Name + "-0123456789ABCDEF", false},
		{Name + "-0123456789abcde", false},
		{Name + "-0123456789abcdef0", false},
		{Name + "-0123456789abcdeg", false},
		{"." + Pinned([]byte("hook v1")) + ".tmp", false},
		{"other-0123456789abcdef", false},
	} {
		if got := IsPinned(tt.name); got != tt.want {
			t.Errorf("IsPinned(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}
