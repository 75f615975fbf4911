package tick

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestLoops(t *testing.T) {
	const interval = time.Second
	tests := []struct {
		name string
		loop func(context.Context, time.Duration, func(time.Time))
		run  time.Duration // how long before ctx ends
		slow time.Duration // how long each call takes
		want []time.Duration
	}{
		{name: "Every calls at once, then every interval", loop: Every, run: 3500 * time.Millisecond,
			want: []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second}},
		{name: "After waits an interval first", loop: After, run: 3500 * time.Millisecond,
			want: []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}},
		{name: "ended before the first tick", loop: After, run: 500 * time.Millisecond},
		{name: "a call that outlasts the interval is followed at once, missed ticks dropped", loop: Every, run: 4200 * time.Millisecond, slow: 1500 * time.Millisecond,
			want: []time.Duration{0, 1500 * time.Millisecond, 3 * time.Second}}, // the end comes during the third: no fourth, though a tick waits
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				ctx, cancel := context.WithTimeout(t.Context(), tt.run)
				defer cancel()
				var got []time.Duration
				tt.loop(ctx, interval, func(now time.Time) {
					got = append(got, now.Sub(start))
					time.Sleep(tt.slow) // sleep: behaviour (a call that takes this long)
				})
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("calls at (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// TestEndedContext: a context ended before the loop starts gets no call,
// not even Every's first.
func TestEndedContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	Every(ctx, time.Hour, func(time.Time) { t.Error("called after the end") })
}

// TestStopFromInside: a loop that cancels its own context from a call
// gets no further call.
func TestStopFromInside(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		n := 0
		Every(ctx, time.Second, func(time.Time) {
			if n++; n == 3 {
				cancel()
			}
		})
		if n != 3 {
			t.Errorf("%d calls, want 3", n)
		}
	})
}
