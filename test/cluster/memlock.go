package cluster

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// capSysResource is CAP_SYS_RESOURCE's bit in /proc/<pid>/status masks.
const capSysResource = 24

// HostMemlock is the memlock (Helm value memlock, --memlock) this host lets
// the hook give containers, and why: "unlimited" where this process may
// raise a hard limit (CAP_SYS_RESOURCE in its effective set, which the
// node's containerd and the hook it runs inherit), else this process's
// hard RLIMIT_MEMLOCK, which nothing it starts can raise. A suite sets it
// so the hook succeeds here; the refusal beyond it is tested on its own.
func HostMemlock() (value, why string, err error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "", "", err
	}
	eff, err := ParseCapMask(string(status), "CapEff")
	if err != nil {
		return "", "", err
	}
	if eff&(1<<capSysResource) != 0 {
		return "unlimited", "CAP_SYS_RESOURCE in this process's effective set", nil
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return "", "", fmt.Errorf("reading RLIMIT_MEMLOCK: %w", err)
	}
	if rl.Max == unix.RLIM_INFINITY {
		return "unlimited", "hard RLIMIT_MEMLOCK unlimited", nil
	}
	return strconv.FormatUint(rl.Max, 10), fmt.Sprintf("no CAP_SYS_RESOURCE, hard RLIMIT_MEMLOCK %d bytes", rl.Max), nil
}
