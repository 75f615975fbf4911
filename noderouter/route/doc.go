// Package route is the router's pure decision core: which function a
// request names, what the router knows about that function's instances, and
// which instance takes the request. It does no I/O and reads no clock.
//
// Names: ParseHeader and ParseHost turn the `x-skipper-function` header
// (`<namespace>/<name>`, or a bare `<name>` given a default namespace) and a
// `Host: <name>.<namespace>.fn` into a Ref whose parts are DNS labels
// (RFC 1123, at most 63 characters). Both are allocation-free (ParseHost
// unless the host has upper-case letters, which it folds, ASCII only): a
// Ref's strings are substrings of the input.
//
// Cache: one Entry per function the router has resolved, kept while the
// function is in use so that its cumulative counters (requests, errors) do
// not go backwards within a router incarnation. An entry leaves (Drop) only
// when it holds no instance: after Remove (the function was deleted) once
// its caller has reported its counters a last time (Entry.Gone), or after
// Idle found it unused for a while. A function that comes back starts a new
// entry, whose counters a reader takes as a reset. An Entry holds an immutable
// *Assignment (generation, instance set, config) swapped atomically; nil means
// the router knows no usable set and must ask the function's owner. Lookups
// are one atomic load of a copy-on-write map plus one atomic load of the
// entry's assignment, so the warm path takes no lock and allocates nothing;
// writers (cold misses, pushed updates, evictions) serialise on a mutex.
//
// Negative: the names the control plane reported unknown, each for a fixed
// TTL, at most a fixed number of them (the oldest leaves first), so that a
// flood of requests for an unknown name does not reach the control plane.
// Only a cache miss consults it; it takes the time from its caller.
//
// Pick: Assignment.Acquire draws two distinct instances from a random
// number the caller supplies and takes a slot on the less loaded (local
// in-flight), skipping instances at the function's concurrencyLimit; the
// slot is a CAS on the instance's in-flight count, so the limit holds under
// any concurrency. Entry.Wait queues a request (FIFO, bounded, no
// goroutine) until Entry.Release hands it a freed slot or a new assignment
// makes room.
//
// Generations: an Assignment replaces the held one only when its generation
// is newer, or when it is the same generation and the held set is empty (a
// refill after evictions, minus the instances evicted from that generation).
// Instances that survive a replacement keep their *Instance, so per-instance
// in-flight counts stay exact across generations.
package route
