package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

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

func memlock(args []string, stdin io.Reader, rl rlimitSetter) error {
	fs := flag.NewFlagSet("memlock", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var devices stringList
	fs.Var(&devices, "device", "ibdev the container gets (repeatable), for the message")
	bytes := fs.String("bytes", "unlimited", "RLIMIT_MEMLOCK, soft and hard: a byte count or unlimited")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("memlock: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("memlock: unexpected arguments %q", fs.Args())
	}
	if len(devices) == 0 {
		return errors.New("memlock: want at least one --device")
	}
	want, err := parseMemlock(*bytes)
	if err != nil {
		return fmt.Errorf("memlock: --bytes: %w", err)
	}
	hcas := "HCA " + strings.Join(devices, ", ")
	if len(devices) > 1 {
		hcas = "HCAs " + strings.Join(devices, ", ")
	}
	st, err := readState(stdin)
	if err != nil {
		return fmt.Errorf("%s: %w", hcas, err)
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
