package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

var (
	imageLine   = regexp.MustCompile(`(?m)^(\s*)image: (.*)$`)
	sysResource = []*regexp.Regexp{regexp.MustCompile(`"SYS_RESOURCE",\s*`), regexp.MustCompile(`(?m)^\s*- SYS_RESOURCE\n`)}
)

// ApplySpec applies a manifest of the repository (a path relative to its
// root) as it must be for this node, writing the adapted copy into dir:
// every container gets imagePullPolicy IfNotPresent (there is no registry;
// busybox is imported, and :latest would mean Always), and SYS_RESOURCE is
// dropped from the capabilities where this machine's bounding set lacks it
// (runc cannot grant it there; IPC_LOCK stays). It returns what it changed,
// for the caller to say.
func ApplySpec(ctx context.Context, cp *cluster.ControlPlane, dir, file string) (string, error) {
	b, err := os.ReadFile(filepath.Join(cluster.RepoRoot(), file))
	if err != nil {
		return "", err
	}
	s := imageLine.ReplaceAllString(string(b), "${1}image: $2\n${1}imagePullPolicy: IfNotPresent")
	note := ""
	if status, err := os.ReadFile("/proc/self/status"); err == nil {
		if bnd, err := cluster.ParseCapMask(string(status), "CapBnd"); err == nil && bnd&(1<<24) == 0 {
			before := s
			for _, re := range sysResource {
				s = re.ReplaceAllString(s, "")
			}
			if s != before {
				note = fmt.Sprintf("this machine's capability bounding set lacks CAP_SYS_RESOURCE: dropped from %s's containers", filepath.Base(file))
			}
		}
	}
	out := filepath.Join(dir, filepath.Base(file))
	if err := os.WriteFile(out, []byte(s), 0o644); err != nil {
		return "", err
	}
	_, err = cluster.ApplyFiles(ctx, cp.Config, false, out)
	return note, err
}
