package draplugin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

// TestCorruptCheckpointOfEarlierBoot: an unreadable checkpoint is moved aside
// either way; one last written before this boot (what a power loss leaves of
// a file that is not fsynced) is an info line and no error, one written
// during this boot, or of an age that cannot be told, an error line and
// background_errors_total{kind="checkpoint"}.
func TestCorruptCheckpointOfEarlierBoot(t *testing.T) {
	booted := time.Date(2026, 7, 1, 10, 30, 0, 0, time.UTC)
	truncated := `{"version":1,"checksum":"00","data":{"cla`
	tests := []struct {
		name     string
		content  string
		modified time.Time
		bootErr  error // of the boot time
		earlier  bool  // want the quiet path
	}{
		{name: "empty, earlier boot", content: "", modified: booted.Add(-time.Hour), earlier: true},
		{name: "truncated, earlier boot", content: truncated, modified: booted.Add(-time.Second), earlier: true},
		{name: "truncated, this boot", content: truncated, modified: booted.Add(time.Hour)},
		{name: "empty, this boot", content: "", modified: booted.Add(time.Minute)},
		{name: "written at the boot time", content: truncated, modified: booted},
		{name: "boot time unknown", content: truncated, modified: booted.Add(-time.Hour), bootErr: errors.New("/proc/stat: no btime line, so no boot time")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			spec, _ := hcatest.Preset("softroce")
			node, err := hcatest.Build(filepath.Join(dir, "node"), spec)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "checkpoint.json")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(path, tt.modified, tt.modified); err != nil {
				t.Fatal(err)
			}
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			d, err := New(klog.NewContext(t.Context(), logger), Config{DriverName: "rdma.dra.dev", NodeName: "vm01", AllowNonHostNetwork: true, RescanInterval: time.Hour}, Deps{
				HCAs:       hca.NewDiscoverer(hca.WithSysfsRoot(node.SysfsRoot), hca.WithDevRoot(node.DevRoot)),
				SpecDir:    cdi.NewSpecDir(filepath.Join(dir, "cdi")),
				Checkpoint: checkpoint.NewStore(path, checkpoint.BootScoped()),
				BootID:     "7e6d5c4b-2222-4a5b-8c9d-ba9876543210",
				BootTime:   func() (time.Time, error) { return booted, tt.bootErr },
			})
			if err != nil {
				t.Fatalf("the driver did not start on an unreadable checkpoint: %v", err)
			}

			// Moved aside in every case, bytes intact; the driver starts empty.
			matches, _ := filepath.Glob(path + ".corrupt-*")
			if len(matches) != 1 {
				t.Fatalf("files moved aside: %v, want one", matches)
			}
			if b, err := os.ReadFile(matches[0]); err != nil || string(b) != tt.content {
				t.Errorf("the file moved aside holds %q (%v), want %q", b, err, tt.content)
			}
			if cp, err := checkpoint.NewStore(path).Load(); err != nil || len(cp.Claims) != 0 {
				t.Errorf("after the start: %d claims, %v; want an empty checkpoint", len(cp.Claims), err)
			}

			var infos, errs []ktesting.LogEntry
			for _, e := range logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
				if !strings.Contains(e.Message, "heckpoint") {
					continue
				}
				if e.Type == ktesting.LogError {
					errs = append(errs, e)
				} else if strings.Contains(e.Message, "earlier boot") {
					infos = append(infos, e)
				}
			}
			count, err := testutil.GetCounterMetricValue(d.metrics.backgroundErrors.WithLabelValues("checkpoint"))
			if err != nil {
				t.Fatal(err)
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if tt.earlier {
				if len(errs) != 0 || len(infos) != 1 {
					t.Errorf("%d error and %d info lines about the checkpoint, want 0 and 1:\n%s", len(errs), len(infos), logs)
				}
				if count != 0 {
					t.Errorf(`background_errors_total{kind="checkpoint"} = %v, want 0`, count)
				}
				for _, want := range []string{"Nothing is lost", "movedTo=", `bootTime="2026-07-01T10:30:00Z"`, `modified="` + tt.modified.Format(time.RFC3339) + `"`} {
					if !strings.Contains(logs, want) {
						t.Errorf("the info line lacks %s:\n%s", want, logs)
					}
				}
				return
			}
			if len(errs) != 1 || len(infos) != 0 || !strings.Contains(errs[0].Message, "Checkpoint is corrupt") || !errors.Is(errs[0].Err, checkpoint.ErrCorrupt) {
				t.Errorf("%d error and %d info lines about the checkpoint, want one error wrapping ErrCorrupt saying it is corrupt:\n%s", len(errs), len(infos), logs)
			}
			if count != 1 {
				t.Errorf(`background_errors_total{kind="checkpoint"} = %v, want 1`, count)
			}
			if tt.bootErr != nil && !strings.Contains(logs, "no btime line") {
				t.Errorf("the error line does not say why the file's age is unknown:\n%s", logs)
			}
		})
	}
}
