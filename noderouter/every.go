package noderouter

import (
	"context"
	"time"

	"skipper.dev/skipper/internal/tick"
)

// every is tick.Every, the one ticker loop. Only stream.go's cache sweep
// still calls it by this name; once it calls tick.Every, this file goes.
func every(ctx context.Context, interval time.Duration, f func(now time.Time)) {
	tick.Every(ctx, interval, f)
}
