package kevents

import (
	"net/netip"
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

// TestWatcherSeesAddressChanges: `ip addr add` and `ip addr del` of an IPv4
// and an IPv6 address each reach the watcher as one Address event. The time
// from the request to the event is logged, not asserted.
func TestWatcherSeesAddressChanges(t *testing.T) {
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
		for _, tt := range []struct {
			prefix string
			name   string // IPv6 messages carry no label
		}{{"192.0.2.7/24", "lo"}, {"2001:db8::7/64", ""}} {
			p := netip.MustParsePrefix(tt.prefix)
			for _, step := range []struct {
				action string
				change func(string, netip.Prefix) error
			}{{"newaddr", keventstest.AddAddress}, {"deladdr", keventstest.DelAddress}} {
				start := time.Now()
				if err := step.change("lo", p); err != nil {
					t.Error(err)
					return
				}
				ev := waitEvent(t, w, func(e Event) bool {
					return e.Source == Address && e.Action == step.action && e.Address == tt.prefix
				})
				t.Logf("%s %s: event after %v: %s", step.action, tt.prefix, time.Since(start), ev)
				if want := (Event{Source: Address, Action: step.action, Subsystem: "net", Name: tt.name, Index: 1, Address: tt.prefix}); ev != want {
					t.Errorf("got %+v, want %+v", ev, want)
				}
			}
		}
	})
}

// TestWatcherIgnoresVethAddresses: addresses on veths, one pair created
// before Open (known from the dump) and one after (known from its
// RTM_NEWLINK), give no event; the dump itself gives none either. Events
// keep their order on the socket, so everything a filter let through
// arrives before the marker address on lo.
func TestWatcherIgnoresVethAddresses(t *testing.T) {
	var noVeth error // skipped from the test's goroutine, not the namespace's
	defer func() {
		if noVeth != nil {
			t.Skipf("cannot create a veth pair here (veth module?): %v", noVeth)
		}
	}()
	inPrivateNetns(t, func() {
		if noVeth = keventstest.AddVeth("vetha0", "vetha1"); noVeth != nil {
			return
		}
		w, err := Open(WithoutUevents())
		if err != nil {
			t.Error(err)
			return
		}
		defer w.Close()
		if err := keventstest.AddVeth("vethb0", "vethb1"); err != nil {
			t.Error(err)
			return
		}
		p := netip.MustParsePrefix("198.51.100.1/24")
		for _, name := range []string{"vetha0", "vethb0"} {
			if err := keventstest.AddAddress(name, p); err != nil {
				t.Error(err)
				return
			}
		}
		marker := netip.MustParsePrefix("192.0.2.9/24")
		if err := keventstest.AddAddress("lo", marker); err != nil {
			t.Error(err)
			return
		}
		var before []Event
		waitEvent(t, w, func(e Event) bool {
			if e.Source == Address && e.Address == marker.String() {
				return true
			}
			before = append(before, e)
			return false
		})
		for _, e := range before {
			t.Errorf("event before the marker: %s", e)
		}
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

// BenchmarkAddressToEvent measures an address added or removed in a
// private network namespace reaching the watcher as an event.
func BenchmarkAddressToEvent(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root to create a network namespace")
	}
	done := make(chan struct{})
	var setupErr error
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the namespace dies with the thread
		if setupErr = unix.Unshare(unix.CLONE_NEWNET); setupErr != nil {
			return
		}
		w, err := Open(WithoutUevents())
		if err != nil {
			b.Error(err)
			return
		}
		defer w.Close()
		p := netip.MustParsePrefix("192.0.2.7/24")
		add := true
		for b.Loop() {
			change, action := keventstest.AddAddress, "newaddr"
			if !add {
				change, action = keventstest.DelAddress, "deladdr"
			}
			add = !add
			if err := change("lo", p); err != nil {
				b.Error(err)
				return
			}
			for ev := range w.Events() {
				if ev.Source == Address && ev.Action == action {
					break
				}
			}
		}
	}()
	<-done
	if setupErr != nil {
		b.Skipf("cannot create a network namespace here: %v", setupErr)
	}
}
