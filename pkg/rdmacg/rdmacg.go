// Package rdmacg reads and sets the kernel's RDMA cgroup limits (rdma.max):
// how many verbs contexts (hca_handle) and objects (hca_object: QPs, CQs,
// MRs, PDs, ...) the processes of a cgroup may hold on one RDMA device.
//
// It is used on two paths: the node daemon asks once at start whether the
// kernel has the controller at all (Available), and the OCI hook sets a new
// container's limit while the runtime creates it (SetLimit), so the container
// never runs without it. Both read only procfs and cgroupfs, under a root
// that tests point at a tree of their own.
package rdmacg

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Unlimited is the value of a limit that is not set ("max" in rdma.max).
const Unlimited = -1

// Limit is one device's line of rdma.max.
type Limit struct {
	Device    string // the ibdev, e.g. mlx5_0
	HCAHandle int64  // Unlimited or >= 0
	HCAObject int64  // Unlimited or >= 0
}

func value(v int64) string {
	if v < 0 {
		return "max"
	}
	return strconv.FormatInt(v, 10)
}

// String is the line as rdma.max takes it.
func (l Limit) String() string {
	return fmt.Sprintf("%s hca_handle=%s hca_object=%s", l.Device, value(l.HCAHandle), value(l.HCAObject))
}

// Validate rejects what the kernel would refuse, with the field named.
func (l Limit) Validate() error {
	if l.Device == "" || strings.ContainsAny(l.Device, " \t\n/") {
		return fmt.Errorf("RDMA device name %q is not a kernel device name", l.Device)
	}
	if l.HCAHandle < Unlimited || l.HCAObject < Unlimited {
		return fmt.Errorf("%s: limits must be >= 0 or unlimited", l.Device)
	}
	return nil
}

// ParseValue reads a limit as rdma.max prints it or a user writes it:
// "max" or a non-negative decimal.
func ParseValue(s string) (int64, error) {
	if s == "max" {
		return Unlimited, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is neither \"max\" nor a non-negative integer", s)
	}
	return v, nil
}

// FS is where procfs is mounted ("/" for the host's /proc): tests use a
// tree of their own.
type FS struct {
	Root string
}

func (f FS) path(p string) string { return filepath.Join(f.Root, p) }

// Available reports whether the kernel has the rdma controller enabled
// (a line "rdma ... 1" in /proc/cgroups); when not, why, for the log.
func (f FS) Available() (bool, string) {
	b, err := os.ReadFile(f.path("/proc/cgroups"))
	if err != nil {
		return false, fmt.Sprintf("reading /proc/cgroups: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		fields := strings.Fields(line)
		if len(fields) == 4 && fields[0] == "rdma" {
			if fields[3] == "1" {
				return true, ""
			}
			return false, "the kernel's rdma cgroup controller is disabled (cgroup_disable=rdma?)"
		}
	}
	return false, "the kernel has no rdma cgroup controller (CONFIG_CGROUP_RDMA is not set)"
}

// Dir is the rdma cgroup directory of process pid: its cgroup v2 directory,
// or on cgroup v1 its directory in the hierarchy that has the rdma
// controller. It fails, naming the file, when pid's cgroup has no rdma
// controller or its hierarchy is not mounted.
func (f FS) Dir(pid int) (string, error) {
	cgFile := fmt.Sprintf("/proc/%d/cgroup", pid)
	b, err := os.ReadFile(f.path(cgFile))
	if err != nil {
		return "", err
	}
	var v1Path, v2Path string
	v1, v2 := false, false
	for line := range strings.Lines(string(b)) {
		parts := strings.SplitN(strings.TrimRight(line, "\n"), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2, v2Path = true, parts[2]
			continue
		}
		v1 = true
		for _, c := range strings.Split(parts[1], ",") {
			if c == "rdma" {
				v1Path = parts[2]
			}
		}
	}
	mounts, err := f.mounts()
	if err != nil {
		return "", err
	}
	if v1Path != "" {
		for _, m := range mounts {
			if m.fstype == "cgroup" && hasOption(m.super, "rdma") {
				return m.join(v1Path)
			}
		}
		return "", fmt.Errorf("%s puts the process in an rdma hierarchy, but no cgroup v1 hierarchy with the rdma controller is mounted", cgFile)
	}
	noRDMA := fmt.Errorf("%s: the process is in no cgroup with the rdma controller", cgFile)
	if !v2 {
		return "", noRDMA
	}
	dir, err := v2Dir(mounts, v2Path)
	if err != nil && v1 {
		// A hybrid host: v1 hierarchies without rdma, and the unified one.
		return "", fmt.Errorf("%w (nor the unified hierarchy: %v)", noRDMA, err)
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", cgFile, err)
	}
	return dir, nil
}

func v2Dir(mounts []mount, cgPath string) (string, error) {
	for _, m := range mounts {
		if m.fstype == "cgroup2" {
			dir, err := m.join(cgPath)
			if err != nil {
				return "", err
			}
			if err := hasController(dir, "rdma"); err != nil {
				return "", err
			}
			return dir, nil
		}
	}
	return "", errors.New("no cgroup2 file system is mounted")
}

// hasController checks dir's cgroup.controllers (v2) lists c.
func hasController(dir, c string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	for _, f := range strings.Fields(string(b)) {
		if f == c {
			return nil
		}
	}
	return fmt.Errorf("%s: the %s controller is not enabled for this cgroup (its parent's cgroup.subtree_control lacks it)", filepath.Join(dir, "cgroup.controllers"), c)
}

type mount struct {
	root, point, fstype, super string
}

// join maps a cgroup path to where it is under this mount.
func (m mount) join(cgPath string) (string, error) {
	rel, err := filepath.Rel(m.root, cgPath)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("cgroup %s is outside the mounted part (%s) of the hierarchy at %s", cgPath, m.root, m.point)
	}
	return filepath.Join(m.point, rel), nil
}

func hasOption(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}

// mounts reads the cgroup mounts from /proc/self/mountinfo: fields 4
// (root) and 5 (mount point), then after " - " the type, source and super
// options. Mount points are under FS.Root.
func (f FS) mounts() ([]mount, error) {
	const file = "/proc/self/mountinfo"
	b, err := os.ReadFile(f.path(file))
	if err != nil {
		return nil, err
	}
	var out []mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 3 || (b[0] != "cgroup" && b[0] != "cgroup2") {
			continue
		}
		out = append(out, mount{root: unescape(a[3]), point: f.path(unescape(a[4])), fstype: b[0], super: b[2]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return out, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Read returns the limits in dir's rdma.max, by device.
func Read(dir string) (map[string]Limit, error) {
	file := filepath.Join(dir, "rdma.max")
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	out := map[string]Limit{}
	for line := range strings.Lines(string(b)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		l := Limit{Device: fields[0], HCAHandle: Unlimited, HCAObject: Unlimited}
		for _, kv := range fields[1:] {
			k, v, _ := strings.Cut(kv, "=")
			n, err := ParseValue(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", file, l.Device, err)
			}
			switch k {
			case "hca_handle":
				l.HCAHandle = n
			case "hca_object":
				l.HCAObject = n
			}
		}
		out[l.Device] = l
	}
	return out, nil
}

// ErrNoDevice is wrapped when the kernel does not know the device (the
// write fails with EINVAL or ENODEV).
var ErrNoDevice = errors.New("the kernel has no such RDMA device")

// Set writes l into dir's rdma.max and reads it back: a limit that did not
// take is an error, never a silent success.
func Set(dir string, l Limit) error {
	if err := l.Validate(); err != nil {
		return err
	}
	file := filepath.Join(dir, "rdma.max")
	if err := os.WriteFile(file, []byte(l.String()+"\n"), 0); err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) && (errors.Is(err, errInval) || errors.Is(err, errNoDev)) {
			return fmt.Errorf("writing %q to %s: %w (%v)", l.String(), file, ErrNoDevice, pe.Err)
		}
		return fmt.Errorf("writing %q to %s: %w", l.String(), file, err)
	}
	got, err := Read(dir)
	if err != nil {
		return fmt.Errorf("reading back %s: %w", file, err)
	}
	if g, ok := got[l.Device]; !ok || g != l {
		return fmt.Errorf("%s holds %q for %s after writing %q", file, g.String(), l.Device, l.String())
	}
	return nil
}
