// Package poll is how the test module waits for a state it cannot watch:
// a condition checked at once and then every interval until it holds, on
// wait.PollUntilContextTimeout. Failures name what was awaited and what
// the condition last saw.
package poll

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Interval is how often For checks its condition.
const Interval = 100 * time.Millisecond

// Cond reports whether the awaited state holds and, when it does not, what
// it saw instead (the last of which a timeout reports). An error ends the
// wait at once.
type Cond func(ctx context.Context) (ok bool, seen string, err error)

// Until checks cond at once and then every interval until it holds, cond
// fails, ctx ends or within passes. cond's ctx ends when within passes.
func Until(ctx context.Context, what string, interval, within time.Duration, cond Cond) error {
	var seen string
	err := wait.PollUntilContextTimeout(ctx, interval, within, true, func(ctx context.Context) (bool, error) {
		ok, s, err := cond(ctx)
		seen = s
		return ok, err
	})
	if seen != "" {
		seen = "; last seen: " + seen
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("waiting for %s: %w%s", what, context.Cause(ctx), seen)
	case wait.Interrupted(err):
		return fmt.Errorf("waiting for %s: not after %s%s", what, within, seen)
	default:
		return fmt.Errorf("waiting for %s: %w", what, err)
	}
}

// For fails tb unless cond holds within d, checking every Interval.
func For(tb testing.TB, what string, within time.Duration, cond func() (ok bool, seen string)) {
	tb.Helper()
	err := Until(context.Background(), what, Interval, within, func(context.Context) (bool, string, error) {
		ok, seen := cond()
		return ok, seen, nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}
