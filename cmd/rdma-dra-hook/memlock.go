package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Memlock gives the container's process the locked-memory limit RDMA needs
// to register memory regions, so the pod needs no CAP_IPC_LOCK (and no
// SYS_RESOURCE): the kernel pins pages for a process that holds
// CAP_IPC_LOCK or whose RLIMIT_MEMLOCK covers them. The hook runs at
// createRuntime, as root on the host, before the container's process
// execs; the limit survives the exec. Pinned pages are still charged to the
// pod's memory cgroup, which bounds them whatever the limit.

// rlimitSetter reads and sets a process's RLIMIT_MEMLOCK: prlimit(2).
type rlimitSetter interface {
	prlimit(pid int, new, old *unix.Rlimit) error
}

type sysPrlimit struct{}

func (sysPrlimit) prlimit(pid int, new, old *unix.Rlimit) error {
	return unix.Prlimit(pid, unix.RLIMIT_MEMLOCK, new, old)
}

// parseMemlock parses --bytes: "unlimited" or a byte count (a K, M or G
// suffix: binary units).
func parseMemlock(s string) (uint64, error) {
	if s == "unlimited" || s == "max" {
		return unix.RLIM_INFINITY, nil
	}
	mult := uint64(1)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = num, u.mult
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 || n > math.MaxUint64/mult {
		return 0, fmt.Errorf("%q is not a positive byte count (e.g. 268435456, 256Mi) or unlimited", s)
	}
	return n * mult, nil
}

func memlockString(v uint64) string {
	if v == unix.RLIM_INFINITY {
		return "unlimited"
	}
	return strconv.FormatUint(v, 10)
}

func memlock(args []string, stdin io.Reader, rl rlimitSetter, log io.Writer) error {
	flags := flag.NewFlagSet("memlock", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	var devices stringList
	flags.Var(&devices, "device", "ibdev the container gets (repeatable), for the message")
	bytes := flags.String("bytes", "unlimited", "RLIMIT_MEMLOCK, soft and hard: a byte count or unlimited")
	if err := flags.Parse(args); err != nil {
		return fmt.Errorf("memlock: %w", err)
	}
	if flags.NArg() > 0 {
		return fmt.Errorf("memlock: unexpected arguments %q", flags.Args())
	}
	if len(devices) == 0 {
		return errors.New("memlock: want at least one --device")
	}
	want, err := parseMemlock(*bytes)
	if err != nil {
		return fmt.Errorf("memlock: --bytes: %w", err)
	}
	hcas := hcasNamed(devices)
	st, err := readState(stdin)
	if err != nil {
		return fmt.Errorf("%s: %w", hcas, err)
	}
	if v, ok, err := specMemlock(st.Bundle); err != nil {
		return fmt.Errorf("%s: %s: %w", hcas, containerName(st), err)
	} else if ok {
		// The runtime applies the spec's rlimits after this hook (runc:
		// "setting rlimits for ready process"): its value wins, and one set
		// here could only make that fail.
		fmt.Fprintf(logOf(log), "rdma-dra-hook: %s: %s: the runtime sets RLIMIT_MEMLOCK %s itself; leaving it\n", hcas, containerName(st), memlockString(v))
		return nil
	}
	var cur unix.Rlimit
	if err := rl.prlimit(st.Pid, nil, &cur); err != nil {
		return fmt.Errorf("%s: reading the memlock limit of %s (pid %d): %w", hcas, containerName(st), st.Pid, err)
	}
	if cur.Cur == want && cur.Max == want {
		return nil // a restarted hook, or the runtime's own setting
	}
	if err := rl.prlimit(st.Pid, &unix.Rlimit{Cur: want, Max: want}, nil); err != nil {
		why := err.Error()
		if errors.Is(err, unix.EPERM) && (want > cur.Max) {
			why = fmt.Sprintf("raising the hard limit from %s needs CAP_SYS_RESOURCE, which the hook lacks here (%v)", memlockString(cur.Max), err)
		}
		return fmt.Errorf("%s: cannot set the memlock limit of %s (pid %d) to %s, so it could not register memory for RDMA without CAP_IPC_LOCK: %s",
			hcas, containerName(st), st.Pid, memlockString(want), why)
	}
	return nil
}

// specMemlock reads RLIMIT_MEMLOCK from the container's OCI spec in its
// bundle, if the runtime set one.
func specMemlock(bundle string) (uint64, bool, error) {
	if bundle == "" {
		return 0, false, nil
	}
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading the container's OCI spec: %w", err)
	}
	var spec struct {
		Process *struct {
			Rlimits []oci.POSIXRlimit `json:"rlimits"`
		} `json:"process"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return 0, false, fmt.Errorf("the container's OCI spec %s: %w", filepath.Join(bundle, "config.json"), err)
	}
	if spec.Process == nil {
		return 0, false, nil
	}
	for _, r := range spec.Process.Rlimits {
		if r.Type == "RLIMIT_MEMLOCK" {
			return r.Soft, true, nil
		}
	}
	return 0, false, nil
}

func logOf(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
