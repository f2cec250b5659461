package draplugin

import (
	"context"
	"errors"
	"sync"
	"time"
)

// The kubelet plugin helper stops its gRPC server with grpc's Stop, which
// cancels the calls in flight: a prepare that finished on our side reaches
// the kubelet as an error, and the kubelet asks the next daemon of a
// rolling update again. Drain, on the way out and before the helper stops,
// lets the calls in flight finish and answer, and keeps later calls from
// doing anything: they wait for their cancellation and the kubelet sends
// them to the next daemon, which does the work once.

// errDraining answers a call that came after Drain, if grpc has not
// cancelled it by then.
var errDraining = errors.New("the driver is stopping; the kubelet retries with the next daemon")

// drainWait bounds how long a call after Drain waits for its cancellation.
const drainWait = 30 * time.Second

// callGate counts the kubelet's calls in flight and closes to new ones.
type callGate struct {
	mu       sync.Mutex
	draining bool
	inFlight sync.WaitGroup
}

// enter admits a call, which must call the returned done when it ends; a
// call after Drain is refused: it waits for its cancellation (or
// drainWait) and returns the error to answer with.
func (g *callGate) enter(ctx context.Context) (done func(), err error) {
	if g.admit() {
		return g.inFlight.Done, nil
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(drainWait):
		return nil, errDraining
	}
}

func (g *callGate) admit() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining {
		return false
	}
	g.inFlight.Add(1)
	return true
}

// close refuses new calls and waits for those in flight.
func (g *callGate) close() {
	g.refuse()
	g.inFlight.Wait()
}

func (g *callGate) refuse() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.draining = true
}

// Drain waits for the prepares and unprepares in flight to finish, then
// gives their answers flush to reach the kubelet. Calls that come after
// Drain began return without touching any state.
func (d *Driver) Drain(flush time.Duration) {
	d.calls.close()
	time.Sleep(flush)
}
