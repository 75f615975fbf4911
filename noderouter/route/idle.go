package route

import "time"

// Idle finds the cache entries that may be dropped for idleness: no
// request for a while, no instance assigned, nothing in flight or queued.
// It tells activity by an entry's Requests counter between calls, so the
// request path pays nothing for it. The zero value is ready to use; one
// goroutine calls Expired periodically.
type Idle struct {
	seen map[*Entry]idleMark
}

type idleMark struct {
	requests uint64
	since    time.Time // when requests last changed (or the entry was first seen)
}

// Expired returns the entries of es (the cache's entries now) that served
// no request for at least ttl as of now and hold no instance, with no
// request in flight or queued. An entry seen for the first time counts as
// active at now. Entries no longer in es are forgotten.
func (s *Idle) Expired(es []*Entry, now time.Time, ttl time.Duration) []*Entry {
	next := make(map[*Entry]idleMark, len(es))
	var out []*Entry
	for _, e := range es {
		n := e.Requests.Load()
		m, ok := s.seen[e]
		if !ok || m.requests != n || e.InFlight.Load() > 0 || e.Queued() > 0 {
			m = idleMark{requests: n, since: now}
		}
		next[e] = m
		if now.Sub(m.since) < ttl {
			continue
		}
		if a := e.assignment.Load(); a != nil && len(a.Instances) > 0 {
			continue
		}
		out = append(out, e)
	}
	s.seen = next
	return out
}
