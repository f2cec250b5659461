package draplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/kevents"
	"github.com/rdma-dra/rdma-dra-driver/pkg/kevents/keventstest"
)

// netdevPublisher reports the netdev attribute of each publish's devices.
type netdevPublisher chan string

func (p netdevPublisher) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	got := ""
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			for _, d := range s.Devices {
				if a, ok := d.Attributes["rdma.dra.dev/netdev"]; ok && a.StringValue != nil {
					got += *a.StringValue
				}
			}
		}
	}
	p <- got
	return nil
}

type countingInventory struct {
	HCASource
	n atomic.Int32
}

func (c *countingInventory) Discover() (hca.Inventory, error) {
	c.n.Add(1)
	return c.HCASource.Discover()
}

// Invalidate passes the driver's "read everything" on, as the Discoverer
// it wraps gets it in the daemon.
func (c *countingInventory) Invalidate() {
	c.HCASource.Invalidate()
}

func startFollowing(t testing.TB, events chan kevents.Event) (*countingInventory, netdevPublisher, func(string) error) {
	t.Helper()
	var counter *countingInventory
	d, node := newTestDriverOn(t, 0, events, func(inv HCASource) HCASource {
		counter = &countingInventory{HCASource: inv}
		return counter
	})
	pub := make(netdevPublisher, 16)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := d.SetPublisher(ctx, pub); err != nil {
		t.Fatal(err)
	}
	if got := <-pub; got != "eth0" {
		t.Fatalf("first publish has netdev %q, want eth0", got)
	}
	go d.Run(ctx)
	rename := func(to string) error {
		inv, err := counter.Discover()
		if err != nil {
			return err
		}
		return node.RenameNetdev(inv.HCAs[0].Netdevs[0], to)
	}
	counter.n.Store(0)
	return counter, pub, rename
}

// TestKernelEventsRescan: with no port watcher and an hour-long rescan
// interval, only a kernel event can make the driver notice a renamed
// netdev; a burst of events is one rescan.
func TestKernelEventsRescan(t *testing.T) {
	t.Parallel()
	events := make(chan kevents.Event, 64)
	counter, pub, rename := startFollowing(t, events)
	if err := rename("ens5f0np0"); err != nil {
		t.Fatal(err)
	}
	counter.n.Store(0)
	for i := range 50 {
		events <- kevents.Event{Source: kevents.Link, Action: "newlink", Name: fmt.Sprintf("x%d", i)}
	}
	select {
	case got := <-pub:
		if got != "ens5f0np0" {
			t.Errorf("published netdev %q after the rename, want ens5f0np0", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no publish within 20 s of the kernel events")
	}
	if n := counter.n.Load(); n != 1 {
		t.Errorf("a burst of 50 events made %d discoveries, want 1", n)
	}

	close(events) // the follower stops; the driver keeps serving
	if err := rename("ens5f0np1"); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-pub:
		t.Errorf("published %q with no event and no rescan due", got)
	case <-time.After(300 * time.Millisecond):
	}
}

// gidIndexPublisher reports the RoCE v2 GID index of each new inventory, -1
// when no HCA has one. The index is not in the slice (docs/attributes.md):
// what follows it is the inventory that claims prepared next get it from
// (NCCL_IB_GID_INDEX, the metadata file, the claim's status).
type gidIndexPublisher chan int64

func (p gidIndexPublisher) see(inv hca.Inventory) {
	select {
	case p <- gidIndexOf(inv):
	default:
	}
}

func gidIndexOf(inv hca.Inventory) int64 {
	got := int64(-1)
	for _, h := range inv.HCAs {
		for _, port := range h.Ports {
			if port.RoCEv2GIDIndex >= 0 {
				got = int64(port.RoCEv2GIDIndex)
			}
		}
	}
	return got
}

// TestAddressEventsRescan: the HCA's netdev gets another IPv4 address, so
// its RoCE v2 GID moves from slot 1 to slot 3 (written to the simulated
// sysfs as ib_core would). With no port watcher and an hour-long rescan
// interval, only the address messages, as the watcher delivers them, can
// make the driver see the new index.
func TestAddressEventsRescan(t *testing.T) {
	t.Parallel()
	events := make(chan kevents.Event, 4)
	pub, node := followGIDs(t, events, nil)
	moveRoCEGID(t, node)
	events <- kevents.Event{Source: kevents.Address, Action: "deladdr", Subsystem: "net", Name: "eth0", Index: 2, Address: "192.168.122.10/24"}
	events <- kevents.Event{Source: kevents.Address, Action: "newaddr", Subsystem: "net", Name: "eth0", Index: 2, Address: "192.168.122.11/24"}
	wantGIDIndex3(t, pub, "no new inventory within 20 s of the address events")
}

// signalingInventory tells, after each discovery, that one has finished.
type signalingInventory struct {
	HCASource
	done chan struct{}
}

func (c signalingInventory) Discover() (hca.Inventory, error) {
	inv, err := c.HCASource.Discover()
	select {
	case c.done <- struct{}{}:
	default:
	}
	return inv, err
}

// The kernel may fill the GID table after the rescan an address event
// caused: the follower rescans once more, with no further event.
func TestAddressEventsRecheck(t *testing.T) {
	t.Parallel()
	events := make(chan kevents.Event, 4)
	scanned := make(chan struct{}, 1)
	pub, node := followGIDs(t, events, func(inv HCASource) HCASource { return signalingInventory{inv, scanned} })
	select {
	case <-scanned: // New's discovery
	default:
	}
	events <- kevents.Event{Source: kevents.Address, Action: "newaddr", Subsystem: "net", Name: "eth0", Index: 2, Address: "192.168.122.11/24"}
	select {
	case <-scanned: // the rescan the event caused, over before the table changes
	case <-time.After(20 * time.Second):
		t.Fatal("no rescan within 20 s of the address event")
	}
	moveRoCEGID(t, node)
	wantGIDIndex3(t, pub, "no new inventory within 20 s: the GID table filled after the event's rescan was never read")
}

// followGIDs runs a driver on the softroce preset, its periodic rescan an
// hour away and port polling off, past its first inventory (RoCE v2 GID
// index 1): only kernel events on the channel make it see another.
func followGIDs(t *testing.T, events chan kevents.Event, wrap func(HCASource) HCASource) (gidIndexPublisher, *hcatest.Node) {
	t.Helper()
	d, node := newTestDriverOn(t, 0, events, wrap)
	pub := make(gidIndexPublisher, 16)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if got := gidIndexOf(d.Inventory()); got != 1 {
		t.Fatalf("first inventory has RoCE v2 GID index %d, want 1 (softroce preset)", got)
	}
	d.pub.onInv = pub.see // before Run: no rescan runs yet
	go d.Run(ctx)
	return pub, node
}

// moveRoCEGID moves rxe0's RoCE v2 GID from slot 1 to slot 3, as the
// kernel does when eth0's address changes to 192.168.122.11.
func moveRoCEGID(t *testing.T, node *hcatest.Node) {
	t.Helper()
	port := filepath.Join(node.IBDevDir("rxe0"), "ports", "1")
	for rel, content := range map[string]string{
		"gids/1":            "0000:0000:0000:0000:0000:0000:0000:0000",
		"gids/3":            "0000:0000:0000:0000:0000:ffff:c0a8:7a0b", // 192.168.122.11
		"gid_attrs/types/3": "RoCE v2",
		"gid_attrs/ndevs/3": "eth0",
	} {
		if err := os.WriteFile(filepath.Join(port, rel), []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// wantGIDIndex3 waits for the next inventory: the moved GID's index.
func wantGIDIndex3(t *testing.T, pub gidIndexPublisher, none string) {
	t.Helper()
	select {
	case got := <-pub:
		if got != 3 {
			t.Errorf("the driver's RoCE v2 GID index is %d, want 3 (the moved GID)", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal(none)
	}
}

// BenchmarkKernelEventToPublish measures a netdev rename reaching the
// published slice through a real kernel event: the benchmark renames the
// netdev in the simulated sysfs, then flips a link in a private network
// namespace, whose rtnetlink message the driver's watcher receives. The
// issue's bound is 1 s; the port watcher would never see a rename.
func BenchmarkKernelEventToPublish(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for a private network namespace")
	}
	flip := make(chan bool)
	flipped := make(chan error)
	watcher := make(chan *kevents.Watcher)
	setup := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the namespace dies with the thread
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			setup <- err
			return
		}
		w, err := kevents.Open(kevents.WithoutUevents())
		if err != nil {
			setup <- err
			return
		}
		setup <- nil
		watcher <- w
		for up := range flip {
			flipped <- keventstest.SetLinkUp("lo", up)
		}
		w.Close()
	}()
	if err := <-setup; err != nil {
		b.Skipf("no private network namespace here: %v", err)
	}
	w := <-watcher
	defer close(flip)
	events := make(chan kevents.Event, 64)
	go func() {
		for ev := range w.Events() {
			events <- ev
		}
	}()
	_, pub, rename := startFollowing(b, events)
	var lat changeLatency
	up := false
	for b.Loop() {
		name := fmt.Sprintf("ens%d", lat.n)
		start := time.Now()
		if err := rename(name); err != nil {
			b.Fatal(err)
		}
		up = !up
		flip <- up
		if err := <-flipped; err != nil {
			b.Fatal(err)
		}
		for got := range pub {
			if got == name {
				break
			}
		}
		lat.add(start)
	}
	lat.report(b)
}
