package tick

import (
	"context"
	"time"
)

// Every calls f with the current time at once and then every interval
// until ctx ends.
func Every(ctx context.Context, interval time.Duration, f func(now time.Time)) {
	run(ctx, interval, true, f)
}

// After is Every without the call at once: f first runs one interval
// after After was called.
func After(ctx context.Context, interval time.Duration, f func(now time.Time)) {
	run(ctx, interval, false, f)
}

func run(ctx context.Context, interval time.Duration, now bool, f func(time.Time)) {
	t := time.NewTicker(interval) // before the first call: ticks count from the start
	defer t.Stop()
	if now && ctx.Err() == nil {
		f(time.Now())
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil {
			return // a tick and the end together: the end wins
		}
		f(time.Now())
	}
}
