package controller

import (
	"skipper.dev/skipper/controller/ring"
)

// syncRing rebuilds the ring from the EndpointSlices and recounts owned
// functions.
func (c *controller) syncRing() {
	members := ring.MembersFromEndpointSlices(c.cache.slices(), ring.PortName)
	old := c.ring.Load()
	var r *ring.Ring
	if len(members) > 0 {
		r, _ = ring.New(members) // non-empty members never fail
	}
	c.ring.Store(r)
	c.fwd.retain(members)
	if (old == nil) != (r == nil) || (old != nil && r != nil && old.Epoch() != r.Epoch()) {
		c.log.Info("ring changed", "members", members, "self", c.self, "in_ring", r != nil && r.Has(c.self))
		// Ownership may have moved: recompute every function's state
		// (invalid ones too: the new owner reports them).
		for _, k := range c.cache.functionKeys() {
			c.fnQueue.Add(k)
		}
	}
	c.metrics.ringMembers.Set(float64(len(members)))
	owned := map[string]bool{}
	for _, k := range c.cache.functionKeys() {
		if c.owns(k) {
			owned[k] = true
		}
	}
	c.mu.Lock()
	moves := 0
	for k := range owned {
		if !c.owned[k] {
			moves++
		}
	}
	for k := range c.owned {
		if !owned[k] {
			moves++
		}
	}
	first := c.ringSynced
	c.owned, c.ringSynced = owned, true
	c.mu.Unlock()
	if first {
		// Functions this replica gained or lost; the first sync is a start,
		// not a move.
		c.metrics.ownershipMoves.Add(float64(moves))
	}
	c.metrics.ownedFunctions.Set(float64(len(owned)))
}

// owner returns the ring member owning key by this replica's view, or ""
// when the ring is empty.
func (c *controller) owner(key string) string {
	r := c.ring.Load()
	if r == nil {
		return ""
	}
	return r.Owner(key)
}

// owns reports whether this replica answers for key: it owns it on the
// ring, or the ring is empty (a replica whose view has no ready member
// serves what it is asked rather than refuse: routers, reading the same
// slices, only call a replica they see as owner).
func (c *controller) owns(key string) bool {
	o := c.owner(key)
	return o == "" || o == c.self
}

// ringView returns the ring's epoch and members as this replica sees them.
func (c *controller) ringView() (uint64, []string) {
	r := c.ring.Load()
	if r == nil {
		return 0, nil
	}
	return r.Epoch(), r.Members()
}
