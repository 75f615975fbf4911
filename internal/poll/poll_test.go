package poll

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// the goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// until runs Until on a recorder in a goroutine of its own and returns its
// failure message ("" when the condition held) and when it returned.
func until(timeout, interval time.Duration, cond func(context.Context) error) (string, time.Duration) {
	r := &fatalRecorder{}
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		Until(r, timeout, interval, "the thing", cond)
	}()
	<-done
	return r.msg, time.Since(start)
}

func TestUntil(t *testing.T) {
	for _, tc := range []struct {
		name      string
		timeout   time.Duration
		okAt      int // the call that returns nil; 0: none does
		wantMsg   string
		wantCalls int
		wantTook  time.Duration
	}{
		{name: "holds at once", timeout: time.Second, okAt: 1, wantCalls: 1},
		{name: "holds at the third call", timeout: time.Second, okAt: 3, wantCalls: 3, wantTook: 2 * 100 * time.Millisecond},
		{name: "never holds", timeout: 950 * time.Millisecond, wantMsg: "the thing: not within 950ms: call 10 saw no thing", wantCalls: 10, wantTook: 950 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				calls := 0
				msg, took := until(tc.timeout, 100*time.Millisecond, func(ctx context.Context) error {
					calls++
					if ctx.Err() != nil {
						return ctx.Err()
					}
					if calls == tc.okAt {
						return nil
					}
					return fmt.Errorf("call %d saw no thing", calls)
				})
				got := struct {
					Msg   string
					Calls int
					Took  time.Duration
				}{msg, calls, took}
				want := struct {
					Msg   string
					Calls int
					Took  time.Duration
				}{tc.wantMsg, tc.wantCalls, tc.wantTook}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("Until (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// TestUntilWaitsIntervalAfterASlowCall: the interval counts from the end
// of a call, so a slow condition is not called again at once.
func TestUntilWaitsIntervalAfterASlowCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var starts []time.Duration
		begin := time.Now()
		until(time.Second, 100*time.Millisecond, func(context.Context) error {
			starts = append(starts, time.Since(begin))
			time.Sleep(300 * time.Millisecond) // sleep: behaviour (a slow condition, on the bubble's fake clock)
			return errors.New("not yet")
		})
		want := []time.Duration{0, 400 * time.Millisecond, 800 * time.Millisecond}
		if diff := cmp.Diff(want, starts); diff != "" {
			t.Errorf("calls began at (-want +got):\n%s", diff)
		}
	})
}

// TestUntilContextEndsAtTimeout: cond's context ends at the timeout.
func TestUntilContextEndsAtTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		msg, took := until(time.Second, time.Hour, func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		})
		if want := "the thing: not within 1s: context deadline exceeded"; msg != want || took != time.Second {
			t.Errorf("Until failed with %q after %s, want %q after 1s", msg, took, want)
		}
	})
}
