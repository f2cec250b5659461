package draplugin

import (
	"context"
	"errors"
	"time"
)

// The kubelet plugin helper stops its gRPC server with grpc's Stop, which
// cancels the calls in flight: a prepare that finished on our side reaches
// the kubelet as an error, and the kubelet asks the next daemon of a
// rolling update again. Drain, on the way out and before the helper stops,
// lets the call in flight finish and answer, and keeps later calls from
// doing anything: they wait for their cancellation and the kubelet sends
// them to the next daemon, which does the work once.

// errDraining answers a call that came after Drain, if grpc has not
// cancelled it by then.
var errDraining = errors.New("the driver is stopping; the kubelet retries with the next daemon")

// drainWait bounds how long a call after Drain waits for its cancellation.
const drainWait = 30 * time.Second

// Drain waits for the prepare or unprepare in flight to finish, then
// gives its answer flush to reach the kubelet. Calls that take the lock
// after Drain began return without touching any state.
func (d *Driver) Drain(flush time.Duration) {
	d.draining.Store(true)
	d.mu.Lock()
	//nolint:staticcheck // an empty critical section: waiting for the holder is the point
	d.mu.Unlock()
	time.Sleep(flush)
}

// refuseWhileDraining is called with mu held at the start of a call: when
// the driver is draining it releases mu, waits for the call's
// cancellation, and returns the error to answer with.
func (d *Driver) refuseWhileDraining(ctx context.Context) error {
	if !d.draining.Load() {
		return nil
	}
	d.mu.Unlock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(drainWait):
		return errDraining
	}
}
