// Package cditest plays the container runtime's part for tests: it loads
// CDI spec files with the CDI library's own cache and injects devices into
// an OCI spec, as containerd does.
package cditest

import (
	"fmt"
	"os"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// InjectInto applies the CDI devices ids, defined by the spec files in dir,
// to spec. A spec file the library refuses is an error, not a silent skip.
func InjectInto(dir string, spec *oci.Spec, ids ...string) error {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return fmt.Errorf("loading CDI specs from %s: %w", dir, err)
	}
	if errs := cache.GetErrors(); len(errs) != 0 {
		return fmt.Errorf("CDI spec errors in %s: %v", dir, errs)
	}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		return fmt.Errorf("injecting %v (unresolved %v): %w", ids, unresolved, err)
	}
	return nil
}

// Inject returns a fresh container spec with ids injected.
func Inject(t testing.TB, dir string, ids ...string) *oci.Spec {
	t.Helper()
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/bin"}}, Linux: &oci.Linux{}}
	if err := InjectInto(dir, spec, ids...); err != nil {
		t.Fatal(err)
	}
	return spec
}

// Node is the device entry an HCA character device becomes in the spec
// where its host node does not exist: no mode (the runtime's default).
func Node(name string, major, minor int64) oci.LinuxDevice {
	return oci.LinuxDevice{Path: "/dev/infiniband/" + name, Type: "c", Major: major, Minor: minor}
}

// NodeMode is Node where the host node exists with mode: the CDI library
// copies the host node's mode.
func NodeMode(name string, major, minor int64, mode os.FileMode) oci.LinuxDevice {
	d := Node(name, major, minor)
	d.FileMode = &mode
	return d
}

// Rule is the device-cgroup rule that lets the container use it.
func Rule(major, minor int64) oci.LinuxDeviceCgroup {
	return oci.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rw"}
}
