// Package route is the router's pure decision core: which function a
// request names, what the router knows about that function's instances, and
// which instance takes the request. It does no I/O and reads no clock.
//
// Names: ParseHeader (`x-skipper-function: <namespace>/<name>`, or a bare
// name given a default namespace) and Hosts.Parse (`<name>.<namespace>.fn`,
// and the names of the Function's own Service: `<name>.<namespace>`,
// `<name>.<namespace>.svc`, `<name>.<namespace>.svc.<cluster domain>`)
// return a Ref of DNS labels whose strings are substrings of the input:
// no allocation (Hosts.Parse folds an upper-case host, ASCII only).
//
// Cache: one Entry per resolved function, holding an immutable *Assignment
// (generation, instance set, config) swapped atomically; nil means the
// owner must be asked. A lookup is two atomic loads (a copy-on-write map,
// the entry's assignment): no lock, no allocation; writers serialise on a
// mutex. An entry is kept while in use, so its cumulative counters never go
// backwards within a router incarnation, and leaves (Drop) only holding no
// instance: after Remove once its counters were reported a last time
// (Entry.Gone), or when Idle found it unused. A function that comes back
// starts a new entry, whose counters a reader takes as a reset.
//
// Negative: names the control plane reported unknown, each for a fixed TTL,
// at most a fixed number (oldest out first); only a cache miss consults it.
//
// Pick: Assignment.Acquire draws two distinct instances from the caller's
// random number and takes a slot on the less loaded, skipping those at the
// function's concurrencyLimit; the slot is a CAS on the instance's
// in-flight count, so the limit holds under any concurrency. Entry.Wait
// queues a request (FIFO, bounded, no goroutine) until Entry.Release hands
// it a freed slot or a new assignment makes room.
//
// Generations: an Assignment replaces the held one only when newer, or of
// the same generation while the held set is empty (a refill after
// evictions, less the evicted). Instances that survive a replacement keep
// their *Instance, so per-instance in-flight counts stay exact.
package route
