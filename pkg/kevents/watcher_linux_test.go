package kevents

import (
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdma-dra/rdma-dra-driver/pkg/kevents/keventstest"
)

// inPrivateNetns runs f on a thread of its own in a new network namespace,
// so the test can change links without touching the host's. The thread is
// never unlocked: the runtime discards it when f returns.
func inPrivateNetns(t *testing.T, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	done := make(chan struct{})
	var setupErr error
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if setupErr = unix.Unshare(unix.CLONE_NEWNET); setupErr != nil {
			return
		}
		f()
	}()
	<-done
	if setupErr != nil {
		t.Skipf("cannot create a network namespace here: %v", setupErr)
	}
}

func waitEvent(t *testing.T, w *Watcher, match func(Event) bool) Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("events closed (%v)", w.Err())
			}
			if match(ev) {
				return ev
			}
		case <-timeout:
			t.Fatal("no matching kernel event within 10 s")
		}
	}
}

func TestWatcherSeesLinkChanges(t *testing.T) {
	inPrivateNetns(t, func() {
		w, err := Open(WithoutUevents())
		if err != nil {
			t.Error(err)
			return
		}
		defer w.Close()
		if err := keventstest.SetLinkUp("lo", true); err != nil {
			t.Errorf("setting lo up: %v", err)
			return
		}
		ev := waitEvent(t, w, func(e Event) bool { return e.Source == Link && e.Name == "lo" && e.Up })
		if ev.Action != "newlink" || ev.Index != 1 {
			t.Errorf("lo up: got %+v, want newlink of index 1", ev)
		}
		if err := keventstest.SetLinkUp("lo", false); err != nil {
			t.Errorf("setting lo down: %v", err)
			return
		}
		waitEvent(t, w, func(e Event) bool { return e.Source == Link && e.Name == "lo" && !e.Up })
	})
}

func TestWatcherSeesKernelUevents(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make the kernel send a uevent (writing /sys/class/net/lo/uevent)")
	}
	w, err := Open(WithoutLink(), func(o *options) { o.allUevents = true })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// A synthetic "change" of lo: the kernel sends it like any other uevent.
	if err := os.WriteFile("/sys/class/net/lo/uevent", []byte("change"), 0); err != nil {
		t.Skipf("sysfs is not writable here: %v", err)
	}
	ev := waitEvent(t, w, func(e Event) bool { return e.Source == Uevent && e.Name == "lo" })
	if ev.Action != "change" || ev.Subsystem != "net" || ev.DevPath != "/devices/virtual/net/lo" {
		t.Errorf("got %+v, want change of net /devices/virtual/net/lo", ev)
	}
}

func TestCloseEndsEvents(t *testing.T) {
	w, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	w.Close()
	select {
	case _, ok := <-w.Events():
		for ok {
			_, ok = <-w.Events()
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Events not closed 5 s after Close")
	}
	if err := w.Err(); err != nil {
		t.Errorf("Close reported as a read error: %v", err)
	}
}
