package controller

import (
	"sync"
	"time"

	"k8s.io/client-go/util/flowcontrol"
)

// maxLimiterCallers bounds the callers a claimLimiter holds a bucket for:
// a router per node, with room to spare.
const maxLimiterCallers = 10000

// claimLimiter bounds the claims each caller's GetInstance calls may
// start: a token bucket (k8s.io/client-go/util/flowcontrol) of
// --claim-rate-per-router and --claim-burst-per-router per caller. A
// bucket idle long enough to have refilled is no different from a new
// one, so it is dropped; beyond maxLimiterCallers buckets, new callers
// share one, so a caller naming itself anew on every call gains nothing
// and costs no memory. A nil *claimLimiter admits everything.
type claimLimiter struct {
	qps   float64
	burst int

	mu        sync.Mutex
	buckets   map[string]*limiterBucket
	overflow  flowcontrol.PassiveRateLimiter
	lastPrune time.Time
}

type limiterBucket struct {
	rl   flowcontrol.PassiveRateLimiter
	used time.Time
}

func newClaimLimiter(qps float64, burst int) *claimLimiter {
	return &claimLimiter{
		qps: qps, burst: burst,
		buckets:  map[string]*limiterBucket{},
		overflow: flowcontrol.NewTokenBucketPassiveRateLimiter(float32(qps), burst),
	}
}

// refill is how long an idle bucket takes to fill up again.
func (l *claimLimiter) refill() time.Duration {
	return time.Duration(float64(l.burst) / l.qps * float64(time.Second))
}

// admit takes a token of caller's bucket at now, or returns
// ErrClaimRateLimited.
func (l *claimLimiter) admit(caller string, now time.Time) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// Pruned once a refill period: each pass is O(buckets), so not per call.
	if refill := l.refill(); now.Sub(l.lastPrune) >= refill {
		for k, b := range l.buckets {
			if now.Sub(b.used) >= refill {
				delete(l.buckets, k)
			}
		}
		l.lastPrune = now
	}
	rl := l.overflow
	if b, ok := l.buckets[caller]; ok {
		b.used, rl = now, b.rl
	} else if len(l.buckets) < maxLimiterCallers {
		b := &limiterBucket{rl: flowcontrol.NewTokenBucketPassiveRateLimiter(float32(l.qps), l.burst), used: now}
		l.buckets[caller], rl = b, b.rl
	}
	if !rl.TryAccept() {
		return withReason(ErrClaimRateLimited, "router %.64q started more claims than %v per second (burst %d) allow; retry later",
			caller, l.qps, l.burst)
	}
	return nil
}

// callers is how many callers hold a bucket.
func (l *claimLimiter) callers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
