package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/internal/hookbin"
)

func TestPinHook(t *testing.T) {
	src := filepath.Join(t.TempDir(), "rdma-dra-hook")
	if err := os.WriteFile(src, []byte("hook"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, hookPath, source, want, wantErr string
	}{
		{name: "pinned beside the plain path", hookPath: "/opt/rdma/bin/rdma-dra-hook", source: src, want: "/opt/rdma/bin/" + hookbin.Pinned([]byte("hook"))},
		{name: "no source: as given", hookPath: "/opt/rdma/bin/rdma-dra-hook", want: "/opt/rdma/bin/rdma-dra-hook"},
		{name: "no hook", hookPath: "", source: src, want: ""},
		{name: "unreadable source", hookPath: "/opt/rdma/bin/rdma-dra-hook", source: src + ".absent", wantErr: "--hook-source=" + src + ".absent"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := &options{hookPath: tt.hookPath, hookSource: tt.source}
			err := pinHook(o)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("pinHook: %v, want an error naming %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || o.hookPath != tt.want {
				t.Fatalf("pinHook: hook path %q, %v; want %q", o.hookPath, err, tt.want)
			}
		})
	}
}
