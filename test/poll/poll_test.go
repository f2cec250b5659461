package poll

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		holdsAt int    // the call on which cond holds; 0: never
		failAt  int    // the call on which cond fails; 0: never
		cancel  bool   // ctx is cancelled before the first call
		want    string // in the error; "" for none
	}{
		{name: "at once", holdsAt: 1},
		{name: "on the third check", holdsAt: 3},
		{name: "never", want: "waiting for the thing: not after 50ms; last seen: call "},
		{name: "cond fails", failAt: 2, want: "waiting for the thing: boom"},
		{name: "ctx ended", cancel: true, want: "waiting for the thing: context canceled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			calls := 0
			err := Until(ctx, "the thing", 5*time.Millisecond, 50*time.Millisecond, func(context.Context) (bool, string, error) {
				calls++
				if calls == tc.failAt {
					return false, "", boom
				}
				return calls == tc.holdsAt, fmt.Sprintf("call %d", calls), nil
			})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Until: %v, want nil", err)
			case tc.want == "":
				if calls != tc.holdsAt {
					t.Errorf("cond called %d times, want %d", calls, tc.holdsAt)
				}
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Errorf("Until: %v, want an error with %q", err, tc.want)
			}
			if tc.failAt != 0 && !errors.Is(err, boom) {
				t.Errorf("Until: %v does not wrap cond's error", err)
			}
		})
	}
}
