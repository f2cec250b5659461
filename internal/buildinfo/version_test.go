package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestResolve(t *testing.T) {
	stamped := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/rdma-dra/rdma-dra-driver", Version: "(devel)"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "5658f81283cce31d189f481366f6817d641f6317"},
			{Key: "vcs.modified", Value: "false"},
		},
	}
	modified := &debug.BuildInfo{Main: stamped.Main, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "5658f81283cce31d189f481366f6817d641f6317"},
		{Key: "vcs.modified", Value: "true"},
	}}
	installed := &debug.BuildInfo{Main: debug.Module{Path: "github.com/rdma-dra/rdma-dra-driver", Version: "v0.2.0"}}
	tests := []struct {
		name            string
		version, commit string
		bi              *debug.BuildInfo
		want            Info
	}{
		{"linker flags win", "0.2.0", "abc123", stamped, Info{"0.2.0", "abc123", runtime.Version()}},
		{"commit from the VCS stamp", "0.2.0", "", stamped, Info{"0.2.0", "5658f81283cce31d189f481366f6817d641f6317", runtime.Version()}},
		{"a modified tree is dirty", "0.2.0", "", modified, Info{"0.2.0", "5658f81283cce31d189f481366f6817d641f6317-dirty", runtime.Version()}},
		{"go install of a module version", "", "", installed, Info{"v0.2.0", Unknown, runtime.Version()}},
		{"nothing known", "", "", nil, Info{Unknown, Unknown, runtime.Version()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resolve(tt.version, tt.commit, tt.bi); got != tt.want {
				t.Errorf("resolve = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestString(t *testing.T) {
	got := Info{"0.2.0", "abc123", "go1.26.0"}.String()
	if want := "0.2.0 (commit abc123, go1.26.0)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}
