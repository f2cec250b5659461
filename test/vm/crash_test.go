package vm

import (
	"os/exec"
	"syscall"
	"testing"
)

// TestCrashOf: a QEMU killed by a fatal signal of its own is a crash (and
// booted again once); our SIGKILL, an exit code and a clean exit are not.
func TestCrashOf(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   syscall.Signal // 0: not a crash
	}{
		{"kill -SEGV $$", syscall.SIGSEGV},
		{"kill -ABRT $$", syscall.SIGABRT},
		{"kill -KILL $$", 0},
		{"exit 1", 0},
		{"exit 0", 0},
	} {
		err := exec.Command("sh", "-c", tc.script).Run()
		got := crashOf(err)
		switch {
		case tc.want == 0 && got != nil:
			t.Errorf("%q: %v, want no crash", tc.script, got)
		case tc.want != 0 && (got == nil || got.sig != tc.want):
			t.Errorf("%q: %v, want a crash by %v", tc.script, got, tc.want)
		}
	}
}
