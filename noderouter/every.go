package noderouter

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// every calls f with the current time at once and then every interval
// until ctx ends (wait.NonSlidingUntilWithContext): the one ticker loop of
// the router's background work (usage sampling, the cache sweep, the BPF
// liveness heartbeat), each of which reads the time it runs at.
func every(ctx context.Context, interval time.Duration, f func(now time.Time)) {
	wait.NonSlidingUntilWithContext(ctx, func(context.Context) { f(time.Now()) }, interval)
}
