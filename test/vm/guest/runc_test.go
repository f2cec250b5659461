package guest

// A minimal runc runtime for the guest: containers share the guest's
// network namespace (hostNetwork pods), see the guest's binaries read-only
// and a /dev holding only what the OCI spec lists; the device cgroup denies
// everything else. CDI devices are injected with the CDI library
// (pkg/cdi/cditest), as containerd does.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi/cditest"
)

const runcRoot = "/run/runc"

// containerSpec is a container running args, with no devices yet.
func containerSpec(id string, args ...string) *specs.Spec {
	ro := []string{"rbind", "ro", "nosuid", "nodev"}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}},
	}
	for _, d := range []string{"/bin", "/sbin", "/usr", "/lib", "/lib64", "/etc"} {
		if _, err := os.Stat(d); err == nil {
			mounts = append(mounts, specs.Mount{Destination: d, Type: "bind", Source: d, Options: ro})
		}
	}
	caps := []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}
	unlimited := ^uint64(0)
	return &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: "rootfs"},
		Hostname: id,
		Process: &specs.Process{
			Args: args, Cwd: "/", Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
			Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			// Verbs pins memory.
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_MEMLOCK", Hard: unlimited, Soft: unlimited}},
			NoNewPrivileges: true,
		},
		Mounts: mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}},
			Resources:   &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
			CgroupsPath: "/vmtest/" + id,
		},
	}
}

// ctrSpec is a container to run.
type ctrSpec struct {
	id   string
	spec *specs.Spec
}

// specsDevice is a device node the container gets (without a cgroup rule).
func specsDevice(name string, major, minor int64, mode os.FileMode) specs.LinuxDevice {
	return specs.LinuxDevice{Path: "/dev/infiniband/" + name, Type: "c", Major: major, Minor: minor, FileMode: &mode}
}

// withCDI injects the CDI devices ids from the driver's spec directory.
func withCDI(t *testing.T, spec *specs.Spec, cdiDir string, ids ...string) *specs.Spec {
	t.Helper()
	if len(ids) == 0 {
		return spec
	}
	if err := cditest.InjectInto(cdiDir, spec, ids...); err != nil {
		t.Fatal(err)
	}
	return spec
}

// ctrResult is a finished container.
type ctrResult struct {
	exit int
	out  string
}

// runContainer runs spec to completion (or the timeout) with runc.
func runContainer(t *testing.T, id string, spec *specs.Spec, timeout time.Duration) ctrResult {
	t.Helper()
	res, err := runContainerErr(id, spec, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func runContainerErr(id string, spec *specs.Spec, timeout time.Duration) (ctrResult, error) {
	bundle := filepath.Join("/tmp/bundles", id)
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		return ctrResult{}, err
	}
	defer os.RemoveAll(bundle)
	b, err := json.MarshalIndent(spec, "", " ")
	if err != nil {
		return ctrResult{}, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		return ctrResult{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// --no-pivot: the guest's root is the initramfs, which pivot_root
	// cannot leave.
	cmd := exec.Command("runc", "--root", runcRoot, "run", "--no-pivot", "--bundle", bundle, id)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return ctrResult{}, fmt.Errorf("runc: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = exec.Command("runc", "--root", runcRoot, "kill", id, "KILL").Run()
		<-done
		_ = exec.Command("runc", "--root", runcRoot, "delete", "-f", id).Run()
		return ctrResult{exit: -1, out: out.String()}, fmt.Errorf("container %s (%s) timed out after %v:\n%s", id, strings.Join(spec.Process.Args, " "), timeout, out.String())
	}
	_ = exec.Command("runc", "--root", runcRoot, "delete", "-f", id).Run()
	res := ctrResult{out: out.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		res.exit = ee.ExitCode()
	} else if err != nil {
		return res, fmt.Errorf("runc run %s: %w\n%s", id, err, out.String())
	}
	return res, nil
}

// listening reports whether a TCP socket listens on port (the guest's
// /proc/net/tcp: containers share its network namespace).
func listening(port int) bool {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return false
	}
	want := fmt.Sprintf(":%04X", port)
	for _, l := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == "0A" {
			return true
		}
	}
	return false
}
