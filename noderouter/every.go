package noderouter

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// every calls f with the current time at once and then every interval
// until ctx ends (wait.NonSlidingUntilWithContext). Usage sampling, the
// cache sweep and the BPF liveness heartbeat run on it. The heartbeat
// report (stream.go), pre-connections (preconnect.go) and the local
// address (localaddr.Manager.Run) keep tickers of their own.
func every(ctx context.Context, interval time.Duration, f func(now time.Time)) {
	wait.NonSlidingUntilWithContext(ctx, func(context.Context) { f(time.Now()) }, interval)
}
