package cluster

// A container runtime for the e2e node agent: runc running OCI bundles the
// way containerd's shim does for a pod's container, so that CDI device
// injection is tested against a real runtime, device cgroup included.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// HostBusybox is the busybox every rootfs gets. It must be static (the
// busybox-static package): the rootfs has no libc.
const HostBusybox = "/bin/busybox"

// rootfsApplets are the commands of a rootfs, as symlinks to busybox.
var rootfsApplets = []string{"sh", "ls", "cat", "env", "grep", "sort", "sleep", "echo", "id", "head", "wc", "tr"}

// Rootfs builds a minimal busybox root filesystem in dir/rootfs and returns
// its absolute path. Containers get it read-only (see ContainerSpec), so one
// Rootfs can serve every container of a test. Building it again in the
// same dir is harmless.
func Rootfs(dir string) (string, error) {
	if err := checkBusybox(); err != nil {
		return "", err
	}
	root, err := filepath.Abs(filepath.Join(dir, "rootfs"))
	if err != nil {
		return "", err
	}
	for _, d := range []string{"bin", "dev", "proc", "sys", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	// MkdirAll obeys the umask: set the sticky, world-writable mode after.
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o755); err != nil {
		return "", err
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky); err != nil {
		return "", err
	}
	if err := copyBusybox(HostBusybox, filepath.Join(root, "bin", "busybox"), 0o755); err != nil {
		return "", err
	}
	for _, a := range rootfsApplets {
		link := filepath.Join(root, "bin", a)
		if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		if err := os.Symlink("busybox", link); err != nil {
			return "", err
		}
	}
	files := map[string]string{
		"passwd": "root:x:0:0:root:/:/bin/sh\n",
		"group":  "root:x:0:\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, "etc", name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	return root, nil
}

// checkBusybox fails unless HostBusybox is a static executable.
func checkBusybox() error {
	f, err := elf.Open(HostBusybox)
	if errors.Is(err, os.ErrNotExist) {
		return errors.New("busybox-static is not installed: apt-get install busybox-static")
	}
	if err != nil {
		return fmt.Errorf("%s: %w", HostBusybox, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (the busybox package): apt-get install busybox-static", HostBusybox)
		}
	}
	return nil
}

func copyBusybox(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	// A fresh file: rewriting the inode a running container executes
	// would fail with ETXTBSY.
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// runcDefaultCaps is the capability set of `runc spec`.
var runcDefaultCaps = []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}

// ContainerSpec returns the OCI spec of a non-terminal container running
// args as root in rootfs, laid out like `runc spec`: read-only rootfs,
// new pid, ipc, uts, mount and network namespaces, a device cgroup that
// denies every device but runc's defaults (so CDI's allow rules are what
// opens RDMA nodes), and runc's capabilities plus addCaps ("IPC_LOCK" or
// "CAP_IPC_LOCK", as a pod's securityContext or the OCI spec spells them).
//
// env is added to PATH, a variable of env replacing the default of the
// same name. /dev/shm is an unsized tmpfs, as kubelet mounts a memory
// emptyDir, and /tmp a tmpfs, since the rootfs is read-only. With
// hostNetwork the container keeps the host's network and UTS namespaces,
// as a hostNetwork pod does. Rlimits are not set: the container inherits
// them from the test process, as a pod inherits containerd's.
func ContainerSpec(rootfs string, args, env, addCaps []string, hostNetwork bool) *specs.Spec {
	caps := append([]string(nil), runcDefaultCaps...)
	for _, c := range addCaps {
		c = ociCapName(c)
		if !slices.Contains(caps, c) {
			caps = append(caps, c)
		}
	}
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: append([]string(nil), args...),
			Env:  ociEnv([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env),
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  caps,
				Effective: append([]string(nil), caps...),
				Permitted: append([]string(nil), caps...),
			},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: rootfs, Readonly: true},
		Hostname: "runc",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "nodev", "mode=1777"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
		},
		Linux: &specs.Linux{
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
			},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.NetworkNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
			},
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
			},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
	if hostNetwork {
		// runc refuses a hostname without a UTS namespace.
		s.Hostname = ""
		s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool {
			return n.Type == specs.NetworkNamespace || n.Type == specs.UTSNamespace
		})
	}
	return s
}

// ociCapName spells a capability as the OCI spec does: CAP_ and upper case.
func ociCapName(c string) string {
	c = strings.ToUpper(c)
	if !strings.HasPrefix(c, "CAP_") {
		c = "CAP_" + c
	}
	return c
}

// ociEnv appends add to base; a variable of add replaces base's.
func ociEnv(base, add []string) []string {
	out := append([]string(nil), base...)
	index := map[string]int{}
	for i, kv := range out {
		k, _, _ := strings.Cut(kv, "=")
		index[k] = i
	}
	for _, kv := range add {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			out[i] = kv
			continue
		}
		index[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// capBits numbers the Linux capabilities (linux/capability.h).
var capBits = func() map[string]uint {
	names := []string{
		"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
		"SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
		"IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
		"SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
		"LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
		"WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
	}
	m := make(map[string]uint, len(names))
	for i, n := range names {
		m["CAP_"+n] = uint(i)
	}
	return m
}()

// CapBit is the bit of a capability in /proc/<pid>/status masks, or -1
// for an unknown name.
func CapBit(name string) int {
	b, ok := capBits[ociCapName(name)]
	if !ok {
		return -1
	}
	return int(b)
}

// UnavailableCaps returns the capabilities of caps that no container
// started from this process can have: unknown names, and those missing
// from its bounding set (a sandbox may drop CAP_SYS_RESOURCE, say). runc
// fails to start a container asking for them; tests that need one skip.
func UnavailableCaps(caps ...string) []string {
	bnd, err := procStatusMask("CapBnd")
	var out []string
	for _, c := range caps {
		b := CapBit(c)
		if b < 0 || err != nil || bnd&(1<<uint(b)) == 0 {
			out = append(out, ociCapName(c))
		}
	}
	return out
}

// procStatusMask reads a capability mask (CapBnd, CapEff...) of this process.
func procStatusMask(field string) (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	return ParseCapMask(string(b), field)
}

// ParseCapMask reads field ("CapEff") out of a /proc/<pid>/status text.
func ParseCapMask(status, field string) (uint64, error) {
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == field {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no %s in the process status", field)
}

// runcLogName is runc's own log in the bundle: its errors, apart from the
// container's output, tell a failed start from a failing container.
const runcLogName = "runc.log"

// killGrace bounds how long a cancelled run may take to die before runc
// itself is killed (and delete --force cleans up after it).
const killGrace = 10 * time.Second

// RunContainer runs spec as container id with `runc run` in the
// foreground, as containerd's shim would, and returns its exit code
// (128+n when killed by signal n) and its output. A non-zero exit is not
// an error; failing to start is, with runc's reason (from its JSON log,
// bundleDir/runc.log). bundleDir is created if missing; runcRoot is runc's
// state dir.
//
// The output is stdout, then stderr, runc's own messages included: runc
// copies the streams through separate pipes, so their interleaving is
// lost anyway, and this order is deterministic.
//
// Cancelling ctx kills the container (SIGKILL) and RunContainer returns
// ctx's error. The container is deleted (runc delete --force) whatever
// happens, so runcRoot is left without state.
//
// Unless the spec sets linux.cgroupsPath, the container's cgroup is
// "<id>-<hash of runcRoot>", relative to runc's own cgroup: runc's default
// (the id) would make one id in two runc roots share a cgroup.
func RunContainer(ctx context.Context, runcRoot, bundleDir, id string, spec *specs.Spec) (exitCode int, output []byte, err error) {
	if err := ctx.Err(); err != nil {
		return -1, nil, fmt.Errorf("container %s: %w", id, err)
	}
	if spec == nil || spec.Process == nil {
		return -1, nil, fmt.Errorf("container %s: spec without a process", id)
	}
	if c := spec.Process.Capabilities; c != nil {
		all := append(append(append([]string(nil), c.Bounding...), c.Effective...), c.Permitted...)
		if bad := UnavailableCaps(all...); len(bad) > 0 {
			return -1, nil, fmt.Errorf("container %s: capabilities unknown or missing from this host's bounding set (CapBnd): %s", id, strings.Join(slices.Compact(slices.Sorted(slices.Values(bad))), ", "))
		}
	}
	runcRoot, err = filepath.Abs(runcRoot)
	if err != nil {
		return -1, nil, err
	}
	bundleDir, err = filepath.Abs(bundleDir)
	if err != nil {
		return -1, nil, err
	}
	if err := writeRuncBundle(bundleDir, runcRoot, id, spec); err != nil {
		return -1, nil, fmt.Errorf("container %s: %w", id, err)
	}
	logPath := filepath.Join(bundleDir, runcLogName)

	var stdout, stderr bytes.Buffer
	cmd := exec.Command("runc", "--root", runcRoot, "--log", logPath, "--log-format", "json",
		"run", "--bundle", bundleDir, id)
	cmd.Dir = bundleDir
	cmd.Env = runcEnv()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// An output pipe stays open while anything holds it; do not wait
	// for strays once runc is gone.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return -1, nil, fmt.Errorf("container %s: starting runc: %w", id, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var waitErr error
	cancelled := false
	select {
	case waitErr = <-done:
	case <-ctx.Done():
		cancelled = true
		waitErr = runcKillRun(runcRoot, id, cmd, done)
	}
	delErr := runcDelete(runcRoot, id)
	output = append(stdout.Bytes(), stderr.Bytes()...)

	exitCode = -1
	var exitErr *exec.ExitError
	switch {
	case waitErr == nil:
		exitCode = 0
	case errors.As(waitErr, &exitErr) && exitErr.Exited():
		exitCode = exitErr.ExitCode()
	case errors.As(waitErr, &exitErr):
		// runc itself was killed.
	default:
		err = fmt.Errorf("container %s: runc: %w", id, waitErr)
	}
	if cancelled {
		err = fmt.Errorf("container %s: %w", id, ctx.Err())
	} else if err == nil && exitCode != 0 {
		if msg := runcErrors(logPath); msg != "" {
			err = fmt.Errorf("container %s: runc failed: %s", id, msg)
		}
	}
	if delErr != nil {
		err = errors.Join(err, delErr)
	}
	return exitCode, output, err
}

// writeRuncBundle writes config.json: a copy of spec with the default
// cgroupsPath, and a fresh runc.log.
func writeRuncBundle(bundleDir, runcRoot, id string, spec *specs.Spec) error {
	data, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	if s.Linux.CgroupsPath == "" {
		sum := sha256.Sum256([]byte(runcRoot))
		s.Linux.CgroupsPath = id + "-" + hex.EncodeToString(sum[:4])
	}
	if data, err = json.MarshalIndent(&s, "", "\t"); err != nil {
		return err
	}
	if err := os.MkdirAll(bundleDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bundleDir, "config.json"), data, 0o644); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(bundleDir, runcLogName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// runcEnv is this process's environment without NOTIFY_SOCKET, which would
// make runc wait for the container to notify a systemd socket.
func runcEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NOTIFY_SOCKET=") {
			env = append(env, kv)
		}
	}
	return env
}

// runcKillRun kills a running `runc run` container and waits for runc. runc
// kill fails until runc has written the container's state, so it is
// retried; runc itself is killed if the container outlives killGrace.
func runcKillRun(runcRoot, id string, cmd *exec.Cmd, done <-chan error) error {
	deadline := time.After(killGrace)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		_ = exec.Command("runc", "--root", runcRoot, "kill", id, "KILL").Run()
		select {
		case err := <-done:
			return err
		case <-deadline:
			_ = cmd.Process.Kill()
			return <-done
		case <-tick.C:
		}
	}
}

// runcDelete removes id's runc state and cgroup, killing the
// container if it still runs; a missing container is success.
func runcDelete(runcRoot, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, "runc", "--root", runcRoot, "delete", "--force", id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("container %s: runc delete --force: %v: %s", id, err, bytes.TrimSpace(b))
	}
	return nil
}

// runcErrors returns the error messages of runc's JSON log, joined.
func runcErrors(logPath string) string {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return ""
	}
	var msgs []string
	for _, line := range bytes.Split(b, []byte("\n")) {
		var e struct{ Level, Msg string }
		if json.Unmarshal(line, &e) == nil && (e.Level == "error" || e.Level == "fatal") {
			msgs = append(msgs, e.Msg)
		}
	}
	return strings.Join(msgs, "; ")
}

var runtimeProbe struct {
	once sync.Once
	ok   bool
	why  string
}

// RuntimeAvailable reports whether RunContainer works here and, if not,
// why, naming what to install. Past the static checks (root, runc in PATH,
// busybox-static) it runs one container, once per process: runc as root
// still fails in an unprivileged container or without cgroups.
func RuntimeAvailable() (bool, string) {
	if os.Geteuid() != 0 {
		return false, "not root: runc needs root to create containers"
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return false, "runc missing: apt-get install runc"
	}
	if err := checkBusybox(); err != nil {
		return false, err.Error()
	}
	runtimeProbe.once.Do(func() {
		runtimeProbe.ok, runtimeProbe.why = probeRunc()
	})
	return runtimeProbe.ok, runtimeProbe.why
}

func probeRunc() (bool, string) {
	dir, err := os.MkdirTemp("", "runc-probe")
	if err != nil {
		return false, err.Error()
	}
	defer os.RemoveAll(dir)
	rootfs, err := Rootfs(dir)
	if err != nil {
		return false, err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := ContainerSpec(rootfs, []string{"echo", "ok"}, nil, nil, false)
	code, out, err := RunContainer(ctx, filepath.Join(dir, "state"), filepath.Join(dir, "bundle"), "probe", spec)
	if err != nil || code != 0 || string(out) != "ok\n" {
		return false, fmt.Sprintf("runc cannot run a container here (exit %d, %v): %s", code, err, bytes.TrimSpace(out))
	}
	return true, ""
}
