package route

import (
	"sync"
	"time"
)

// Negative remembers functions the control plane said do not exist, each
// for TTL from when it was added, so that a flood of requests for an
// unknown name costs one GetInstance per TTL instead of one per request.
//
// It holds at most Max names. Every name lives for the same TTL, so the
// order names were added in is the order they expire in: a FIFO gives both
// the expiry sweep and the eviction when full (the oldest name goes) in
// O(1). A nil *Negative, or one with TTL or Max of zero, remembers nothing.
// It is safe for concurrent use; it reads no clock (callers pass now).
type Negative struct {
	ttl time.Duration
	max int

	mu   sync.Mutex
	exp  map[Ref]time.Time // expiry of each remembered name
	fifo []negItem         // ring of names in the order added; len max
	head int               // index of the oldest item
	n    int               // items in the ring (live or superseded)
}

// negItem is one addition. It is superseded when its name was added again
// later (the map then holds a later expiry) and is skipped when it leaves
// the ring.
type negItem struct {
	ref Ref
	exp time.Time
}

// NewNegative returns a negative cache remembering up to max names for ttl.
func NewNegative(ttl time.Duration, max int) *Negative {
	if ttl <= 0 || max <= 0 {
		return nil
	}
	return &Negative{ttl: ttl, max: max, exp: make(map[Ref]time.Time), fifo: make([]negItem, max)}
}

// Contains reports whether r was added less than TTL before now.
func (c *Negative) Contains(r Ref, now time.Time) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	exp, ok := c.exp[r]
	c.mu.Unlock()
	return ok && now.Before(exp)
}

// Add remembers r until now+TTL, dropping expired names and, when full,
// the oldest one.
func (c *Negative) Add(r Ref, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.n > 0 && !now.Before(c.fifo[c.head].exp) {
		c.pop()
	}
	if c.n == c.max {
		c.pop()
	}
	if _, ok := c.exp[r]; !ok {
		// r may be a substring of a request header: copy it so the cache
		// does not pin the request.
		r = Ref{Namespace: clone(r.Namespace), Name: clone(r.Name)}
	}
	it := negItem{ref: r, exp: now.Add(c.ttl)}
	c.exp[r] = it.exp
	c.fifo[(c.head+c.n)%c.max] = it
	c.n++
}

// pop removes the oldest item, and its name unless a later Add superseded it.
func (c *Negative) pop() {
	it := c.fifo[c.head]
	if exp, ok := c.exp[it.ref]; ok && exp.Equal(it.exp) {
		delete(c.exp, it.ref)
	}
	c.fifo[c.head] = negItem{}
	c.head = (c.head + 1) % c.max
	c.n--
}

// Len returns how many names are remembered, expired ones not yet dropped
// included.
func (c *Negative) Len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.exp)
}
