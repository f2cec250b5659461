package draplugin_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// TestNewerCheckpointRefused: a daemon of an older release (a rollback
// across a format change) on a checkpoint of a newer format version does
// not start, says which file and versions, and leaves the file as it was:
// forgetting its prepared claims would hand their HCAs out twice.
func TestNewerCheckpointRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	orig, err := os.ReadFile("../checkpoint/testdata/checkpoint-v2.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.checkpointPath(), orig, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = draplugin.New(context.Background(), draplugin.Config{DriverName: driverName, NodeName: nodeName, AllowNonHostNetwork: true}, draplugin.Deps{
		HCAs:       hca.NewDiscoverer(hca.WithSysfsRoot(e.node.SysfsRoot), hca.WithDevRoot(e.node.DevRoot), hca.WithReadFile(e.node.ReadFile)),
		SpecDir:    cdi.NewSpecDir(e.cdiDir),
		Checkpoint: checkpoint.NewStore(e.checkpointPath()),
		BootID:     bootB,
	})
	if err == nil {
		t.Fatal("the driver started on a checkpoint of format version 2")
	}
	if errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("a newer format is reported as corrupt (which quarantines it): %v", err)
	}
	for _, want := range []string{e.checkpointPath(), "format version 2", "versions up to 1", "newer release"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if got, _ := os.ReadFile(e.checkpointPath()); !bytes.Equal(got, orig) {
		t.Errorf("the checkpoint was changed:\n%s", got)
	}
	if entries, _ := os.ReadDir(e.stateDir); len(entries) != 1 {
		t.Errorf("state dir holds %d entries, want only the checkpoint (nothing quarantined)", len(entries))
	}
}
