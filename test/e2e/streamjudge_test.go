package e2e

import (
	"testing"
	"time"
)

// TestRuntimeKilledDuring: a pod is forgiven a lost start or exit only if
// a kill of the kubelet or containerd overlapped its life.
func TestRuntimeKilledDuring(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	s := &podStream{runtimeDown: []window{{from: at(100), to: at(105)}}}
	for _, tt := range []struct {
		name     string
		from, to int
		want     bool
	}{
		{"pod lived through the kill", 90, 120, true},
		{"pod created while the runtime was down", 102, 120, true},
		{"pod created in the grace after the restart", 110, 120, true},
		{"pod created after the grace", 116, 130, false},
		{"pod ended before the kill", 80, 99, false},
		{"pod observed at the kill's start", 80, 100, true},
	} {
		if got := s.runtimeKilledDuring(at(tt.from), at(tt.to)); got != tt.want {
			t.Errorf("%s: runtimeKilledDuring(%d, %d) = %v, want %v", tt.name, tt.from, tt.to, got, tt.want)
		}
	}
	if (&podStream{}).runtimeKilledDuring(at(0), at(1000)) {
		t.Error("a stream with no kills forgave a pod")
	}
}
