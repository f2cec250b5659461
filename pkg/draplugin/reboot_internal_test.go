package draplugin

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
)

// TestDiscardPreviousBootSaysSoOnce: one log line names what was discarded
// and why; nothing is said when nothing is.
func TestDiscardPreviousBootSaysSoOnce(t *testing.T) {
	const before, now = "0f3b2c4d-1111-4a5b-8c9d-0123456789ab", "7e6d5c4b-2222-4a5b-8c9d-ba9876543210"
	tests := []struct {
		name      string
		claims    map[string]string // claim name -> boot ID
		wantLines int
		wantKept  int
	}{
		{"reboot", map[string]string{"a": before, "b": before, "c": now}, 1, 1},
		{"same boot", map[string]string{"a": now, "b": now}, 0, 2},
		{"no boot ID recorded", map[string]string{"a": ""}, 0, 1},
		{"empty checkpoint", nil, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			store := checkpoint.NewStore(filepath.Join(dir, "checkpoint.json"))
			cp := checkpoint.Checkpoint{Claims: map[string]checkpoint.Claim{}}
			for name, boot := range tt.claims {
				cp.Claims["uid-"+name] = checkpoint.Claim{UID: "uid-" + name, Namespace: "ns", Name: name, BootID: boot, PreparedAt: time.Now()}
			}
			if err := store.Save(cp); err != nil {
				t.Fatal(err)
			}
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			s := &claimState{store: store, specs: cdi.NewSpecDir(filepath.Join(dir, "cdi")), bootID: now, metrics: NewMetrics()}
			if err := s.discardPreviousBoot(klog.NewContext(t.Context(), logger)); err != nil {
				t.Fatal(err)
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if n := strings.Count(logs, "The node rebooted"); n != tt.wantLines {
				t.Errorf("%d log lines about the reboot, want %d:\n%s", n, tt.wantLines, logs)
			}
			if tt.wantLines == 1 {
				for _, want := range []string{"discarded=2", `claims=["ns/a","ns/b"]`, `previousBootIDs=["` + before + `"]`, "the kubelet prepares again"} {
					if !strings.Contains(logs, want) {
						t.Errorf("the log line lacks %s:\n%s", want, logs)
					}
				}
			}
			got, err := checkpoint.NewStore(store.Path()).Load()
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Claims) != tt.wantKept {
				t.Errorf("%d claims kept, want %d", len(got.Claims), tt.wantKept)
			}
		})
	}
}
