package route

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"skipper.dev/skipper/noderouter/callers"
)

// Config is what the router needs to route to a function.
type Config struct {
	// ConcurrencyLimit per instance; 0 means none.
	ConcurrencyLimit uint32
	Oneshot          bool
	// Timeout per request; 0 means the router's default.
	Timeout time.Duration
	// MaxBodyBytes bounds a request body; 0 means the router's
	// --max-body-bytes.
	MaxBodyBytes int64
	// Callers who may call the function; nil: anyone.
	Callers *callers.Policy
}

// InstanceInfo describes an instance as the controller announces it.
type InstanceInfo struct {
	Pod    string
	PodUID string
	// Address is the ip:port the instance serves HTTP on.
	Address string
	Node    string
}

// Instance is an instance with the router's local counters. Counters are
// updated by the request path with atomics.
type Instance struct {
	InstanceInfo
	InFlight atomic.Int64
	Requests atomic.Uint64
}

// Assignment is one generation of a function's instance set. It is
// immutable once stored; the cache replaces it whole.
type Assignment struct {
	Generation uint64
	Instances  []*Instance
	Config     Config
	// evicted are the pod UIDs removed from this generation by Evict; a
	// refill of the same generation leaves them out.
	evicted []string
}

// Entry is one function's cache slot. It is created on the first successful
// resolution (or pushed update) and lives until Drop takes it out: after
// the function was removed (Remove) and reported a last time, or after it
// sat idle with no instance (Idle).
type Entry struct {
	Ref Ref
	// Key is Ref.String(), computed once.
	Key string

	assignment atomic.Pointer[Assignment]
	q          queue
	// removed: the control plane said the function is gone (Remove); a
	// later Store clears it.
	removed atomic.Bool

	InFlight atomic.Int64
	// Cumulative for the router's incarnation.
	Requests atomic.Uint64
	Errors   atomic.Uint64
	Cold     atomic.Uint64
}

// Assignment returns the current assignment, nil when none is usable.
func (e *Entry) Assignment() *Assignment { return e.assignment.Load() }

// Cache maps functions to their entries. The zero value is ready to use.
type Cache struct {
	mu sync.Mutex // serialises writers
	m  atomic.Pointer[map[Ref]*Entry]
}

// Lookup returns the function's entry and its current assignment. Either may
// be nil. It takes no lock and does not allocate.
func (c *Cache) Lookup(r Ref) (*Entry, *Assignment) {
	m := c.m.Load()
	if m == nil {
		return nil, nil
	}
	e := (*m)[r]
	if e == nil {
		return nil, nil
	}
	return e, e.assignment.Load()
}

// entry returns r's entry, creating it. c.mu must be held.
func (c *Cache) entry(r Ref) *Entry {
	old := c.m.Load()
	if old != nil {
		if e := (*old)[r]; e != nil {
			return e
		}
	}
	// Strings may be substrings of a request header: copy them so the entry
	// does not pin the request.
	r = Ref{Namespace: clone(r.Namespace), Name: clone(r.Name)}
	e := &Entry{Ref: r, Key: r.String()}
	var n map[Ref]*Entry
	if old == nil {
		n = make(map[Ref]*Entry, 1)
	} else {
		n = make(map[Ref]*Entry, len(*old)+1)
		for k, v := range *old {
			n[k] = v
		}
	}
	n[r] = e
	c.m.Store(&n)
	return e
}

func clone(s string) string { return string([]byte(s)) }

// Update is a new instance set for a function.
type Update struct {
	Generation uint64
	Instances  []InstanceInfo
	Config     Config
}

// Store applies u to r's entry, creating the entry, and returns the entry
// and the assignment now held (which is the old one when u was stale).
// applied reports whether u replaced it.
func (c *Cache) Store(r Ref, u Update) (e *Entry, held *Assignment, applied bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e = c.entry(r)
	old := e.assignment.Load()
	var evicted []string
	switch {
	case old == nil || u.Generation > old.Generation:
	case u.Generation == old.Generation && len(old.Instances) == 0:
		evicted = old.evicted
	default:
		return e, old, false
	}
	next := &Assignment{Generation: u.Generation, Config: u.Config, evicted: evicted}
	next.Instances = make([]*Instance, 0, len(u.Instances))
	for _, info := range u.Instances {
		if slices.Contains(evicted, info.PodUID) {
			continue
		}
		// Requests in flight hold the old *Instance and decrement it when they
		// end, so an unchanged instance must stay the same object.
		in := old.find(info.PodUID)
		if in == nil || in.InstanceInfo != info {
			in = &Instance{InstanceInfo: info}
		}
		next.Instances = append(next.Instances, in)
	}
	e.assignment.Store(next)
	e.removed.Store(false)
	e.q.wakeAll()
	return e, next, true
}

func (a *Assignment) find(uid string) *Instance {
	if a == nil {
		return nil
	}
	for _, in := range a.Instances {
		if in.PodUID == uid {
			return in
		}
	}
	return nil
}

// Remove drops r's assignment when it is not newer than generation (the
// function was deleted) and marks the entry removed. The entry and its
// counters stay until the caller has reported them a last time and calls
// Drop (see Entry.Gone). It returns the generation held afterwards (0 when
// none).
func (c *Cache) Remove(r Ref, generation uint64) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, old := c.Lookup(r)
	if e == nil {
		return 0
	}
	if old != nil && old.Generation > generation {
		return old.Generation
	}
	e.assignment.Store(nil)
	e.removed.Store(true)
	e.q.wakeAll()
	return 0
}

// Gone reports whether e was removed (and not stored again since) and has
// no request in flight or queued: once its counters were reported a last
// time, Drop may take it out.
func (e *Entry) Gone() bool {
	return e.removed.Load() && e.InFlight.Load() == 0 && e.Queued() == 0
}

// Drop takes e out of the cache when it is still its function's entry and
// holds no instance (its assignment is nil or empty), and reports whether
// it did. Requests that hold e finish with it; the next request for the
// function starts a new entry (a cache miss). The entry's counters start
// again from zero then, which a reader of cumulative counters takes as a
// reset. With removed, e is dropped only while it is still marked removed:
// a Store since (the function came back) keeps it.
func (c *Cache) Drop(e *Entry, removed bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old == nil || (*old)[e.Ref] != e {
		return false
	}
	if removed && !e.removed.Load() {
		return false
	}
	if a := e.assignment.Load(); a != nil && len(a.Instances) > 0 {
		return false
	}
	n := make(map[Ref]*Entry, len(*old)-1)
	for k, v := range *old {
		if v != e {
			n[k] = v
		}
	}
	c.m.Store(&n)
	return true
}

// Evict removes the instance with podUID from r's current assignment (its
// address stopped answering) and reports whether it was there. The
// generation is kept, so a newer generation from the controller still
// replaces the set.
func (c *Cache) Evict(r Ref, podUID string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, old := c.Lookup(r)
	if old == nil {
		return false
	}
	i := slices.IndexFunc(old.Instances, func(in *Instance) bool { return in.PodUID == podUID })
	if i < 0 {
		return false
	}
	next := &Assignment{
		Generation: old.Generation,
		Config:     old.Config,
		Instances:  slices.Delete(slices.Clone(old.Instances), i, i+1),
		evicted:    append(slices.Clone(old.evicted), podUID),
	}
	e.assignment.Store(next)
	e.q.wakeAll()
	return true
}

// Entries returns every entry, in no particular order.
func (c *Cache) Entries() []*Entry {
	m := c.m.Load()
	if m == nil {
		return nil
	}
	out := make([]*Entry, 0, len(*m))
	for _, e := range *m {
		out = append(out, e)
	}
	return out
}
