package rdmacg

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

// The kubelet names a pod's cgroup after its UID: "pod<uid>" with the
// cgroupfs driver, "kubepods[-<qos>]-pod<uid, '-' as '_'>.slice" with the
// systemd driver. A container's cgroup is directly under it.
var (
	cgroupfsPod = regexp.MustCompile(`^pod([0-9A-Za-z-]+)$`)
	systemdPod  = regexp.MustCompile(`^kubepods(?:-[a-z]+)?-pod([0-9A-Za-z_]+)\.slice$`)
)

// PodDir is the cgroup of the pod whose container has the cgroup
// directory containerDir, and the pod's UID as the kubelet named it. It
// fails, naming the directory, when the parent is not a pod's cgroup (a
// container not run by the kubelet, or a runtime nesting its own level).
func PodDir(containerDir string) (dir, uid string, err error) {
	dir = filepath.Dir(containerDir)
	name := filepath.Base(dir)
	if m := cgroupfsPod.FindStringSubmatch(name); m != nil {
		return dir, m[1], nil
	}
	if m := systemdPod.FindStringSubmatch(name); m != nil {
		return dir, strings.ReplaceAll(m[1], "_", "-"), nil
	}
	return dir, "", fmt.Errorf("%s, the parent of the container's cgroup, is not a pod's cgroup (the kubelet names them pod<uid> or kubepods-<qos>-pod<uid>.slice)", dir)
}
