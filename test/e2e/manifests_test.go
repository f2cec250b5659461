package e2e

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

// TestShippedManifestsAccepted: every DeviceClass we ship and every demo
// spec the docs show is accepted by the real API server (CEL selectors
// compile, fields are known).
func TestShippedManifestsAccepted(t *testing.T) {
	t.Parallel() // no node: see parallel in main_test.go
	cp, err := cluster.StartControlPlane(t, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	root := cluster.RepoRoot()
	files, _ := filepath.Glob(filepath.Join(root, "deployments", "*.yaml"))
	specs, _ := filepath.Glob(filepath.Join(root, "demo", "specs", "*.yaml"))
	files = append(files, specs...)
	if len(files) < 5 {
		t.Fatalf("found only %v", files)
	}
	objs, err := cluster.ApplyFiles(context.Background(), cp.Config, false, files...)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	if kinds["DeviceClass"] != 4 || kinds["Job"] != 2 || kinds["ResourceClaimTemplate"] != 1 || kinds["ResourceClaim"] != 1 {
		t.Errorf("created %v", kinds)
	}
}
