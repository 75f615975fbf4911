package noderouter

import (
	"context"
	"time"
)

// every calls f with the tick time every interval until ctx ends: the one
// ticker loop of the router's background work (usage sampling, the cache
// sweep, the BPF liveness heartbeat).
func every(ctx context.Context, interval time.Duration, f func(now time.Time)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			f(now)
		}
	}
}
