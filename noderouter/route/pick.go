package route

import (
	"slices"
	"sync/atomic"
)

// Acquire picks an instance for one request by the power of two choices and
// takes a slot on it (adds 1 to its InFlight): of two distinct instances
// drawn by r (any uniform random number; the caller draws it), the one with
// fewer local in-flight requests, the first on a tie. With limit > 0 (the
// function's concurrencyLimit) an instance already holding limit requests
// is not taken; when both candidates are full or excluded the whole set is
// scanned from the first candidate for the least loaded one that has room.
// Instances in except (those that already failed the request) are skipped.
// It returns nil when no instance can take the request; the caller releases
// the slot with Entry.Release.
func (a *Assignment) Acquire(r uint64, limit uint32, except []*Instance) *Instance {
	n := len(a.Instances)
	if n == 0 {
		return nil
	}
	i := int(r % uint64(n))
	if n > 1 {
		j := int((r >> 32) % uint64(n-1))
		if j >= i {
			j++
		}
		x, y := a.Instances[i], a.Instances[j]
		if y.InFlight.Load() < x.InFlight.Load() {
			x, y = y, x
		}
		for _, in := range [2]*Instance{x, y} {
			if usable(in, except) && in.tryAcquire(limit) {
				return in
			}
		}
	}
	// Both candidates full or excluded (or a single instance): the least
	// loaded of the rest that has room. A slot taken concurrently by another
	// request makes the CAS fail; the next scan position is tried.
	for range n {
		var best *Instance
		bestLoad := int64(-1)
		for k := range n {
			in := a.Instances[(i+k)%n]
			if !usable(in, except) {
				continue
			}
			if l := in.InFlight.Load(); (limit == 0 || l < int64(limit)) && (bestLoad < 0 || l < bestLoad) {
				best, bestLoad = in, l
			}
		}
		if best == nil {
			return nil
		}
		if best.tryAcquire(limit) {
			return best
		}
	}
	return nil
}

func usable(in *Instance, except []*Instance) bool {
	return len(except) == 0 || !slices.Contains(except, in)
}

// tryAcquire adds one to the instance's in-flight count unless limit > 0
// and it already holds limit requests.
func (in *Instance) tryAcquire(limit uint32) bool {
	if limit == 0 {
		in.InFlight.Add(1)
		return true
	}
	return casBelow(&in.InFlight, int64(limit))
}

// casBelow adds one to v unless it is already at least max.
func casBelow(v *atomic.Int64, max int64) bool {
	for {
		cur := v.Load()
		if cur >= max {
			return false
		}
		if v.CompareAndSwap(cur, cur+1) {
			return true
		}
	}
}

// has reports whether in is one of a's instances (the same object).
func (a *Assignment) has(in *Instance) bool {
	return a != nil && slices.Contains(a.Instances, in)
}
