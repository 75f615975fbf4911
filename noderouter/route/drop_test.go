package route

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRemoveAndDrop: a removed function's entry is Gone once nothing is in
// flight or queued, and Drop takes out only an entry that holds no
// instance and is still the cache's.
func TestRemoveAndDrop(t *testing.T) {
	type state struct {
		Removed, Gone, Dropped, Cached bool
	}
	tests := []struct {
		name    string
		prep    func(c *Cache) *Entry
		removed bool // Drop as a removed entry (after its last report)
		want    state
	}{
		{"removed", func(c *Cache) *Entry {
			e, _, _ := c.Store(fn, Update{Generation: 1, Instances: infos("1")})
			c.Remove(fn, 1)
			return e
		}, false, state{Removed: true, Gone: true, Dropped: true}},
		{"removed with no assignment held (a NotFound)", func(c *Cache) *Entry {
			e, _, _ := c.Store(fn, Update{Generation: 1, Instances: infos("1")})
			c.Evict(fn, "1")
			c.Remove(fn, 1)
			c.Remove(fn, 0)
			return e
		}, false, state{Removed: true, Gone: true, Dropped: true}},
		{"removed with a request in flight: not gone yet", func(c *Cache) *Entry {
			e, _, _ := c.Store(fn, Update{Generation: 1, Instances: infos("1")})
			e.InFlight.Add(1)
			c.Remove(fn, 1)
			return e
		}, false, state{Removed: true, Dropped: true}},
		{"stale removal keeps the entry", func(c *Cache) *Entry {
			e, _, _ := c.Store(fn, Update{Generation: 5, Instances: infos("1")})
			c.Remove(fn, 4)
			return e
		}, false, state{Cached: true}},
		{"stored again after the removal", func(c *Cache) *Entry {
			e, _, _ := c.Store(fn, Update{Generation: 1, Instances: infos("1")})
			c.Remove(fn, 1)
			c.Store(fn, Update{Generation: 2, Instances: infos("2")})
			return e
		}, false, state{Cached: true}},
		{"no instance assigned (scaled to zero)", func(c *Cache) *Entry {
			e, _, _ := c.Store(fn, Update{Generation: 1})
			return e
		}, false, state{Dropped: true}},
		{"removed, then stored again with no instance: kept when dropped as removed", func(c *Cache) *Entry {
			e, _, _ := c.Store(fn, Update{Generation: 1, Instances: infos("1")})
			c.Remove(fn, 1)
			c.Store(fn, Update{Generation: 2})
			return e
		}, true, state{Cached: true}},
		{"an entry the cache no longer holds", func(c *Cache) *Entry {
			e, _, _ := c.Store(fn, Update{Generation: 1})
			c.Drop(e, false)
			c.Store(fn, Update{Generation: 2})
			return e
		}, false, state{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Cache
			other, _, _ := c.Store(Ref{"other", "fn"}, Update{Generation: 1})
			e := tt.prep(&c)
			got := state{Removed: e.removed.Load(), Gone: e.Gone(), Dropped: c.Drop(e, tt.removed)}
			held, _ := c.Lookup(fn)
			got.Cached = held == e
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if o, _ := c.Lookup(other.Ref); o != other {
				t.Errorf("Drop took out another function's entry")
			}
		})
	}
}

func TestIdleExpired(t *testing.T) {
	const ttl = 10 * time.Minute
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var c Cache
	zero, _, _ := c.Store(Ref{"ns", "zero"}, Update{Generation: 1})                        // no instance
	busy, _, _ := c.Store(Ref{"ns", "busy"}, Update{Generation: 1})                        // no instance, requests keep coming
	held, _, _ := c.Store(Ref{"ns", "held"}, Update{Generation: 1, Instances: infos("1")}) // instances assigned
	long, _, _ := c.Store(Ref{"ns", "long"}, Update{Generation: 1})                        // one long request in flight
	long.InFlight.Add(1)
	gone, _, _ := c.Store(Ref{"ns", "gone"}, Update{Generation: 1})
	c.Remove(gone.Ref, 1) // removed, its last report never sent

	keys := func(es []*Entry) []string {
		out := []string{}
		for _, e := range es {
			out = append(out, e.Key)
		}
		return out
	}
	var idle Idle
	steps := []struct {
		at   time.Duration
		prep func()
		want []string
	}{
		{at: 0, want: []string{}},
		{at: ttl - time.Second, prep: func() { busy.Requests.Add(1) }, want: []string{}},
		{at: ttl, want: []string{"ns/gone", "ns/zero"}},
		{at: ttl + time.Minute, prep: func() { c.Store(held.Ref, Update{Generation: 2}) }, want: []string{"ns/gone", "ns/held", "ns/zero"}},
		{at: 2*ttl - time.Second, prep: func() { long.InFlight.Add(-1) }, want: []string{"ns/busy", "ns/gone", "ns/held", "ns/zero"}},
		{at: 3 * ttl, want: []string{"ns/busy", "ns/gone", "ns/held", "ns/long", "ns/zero"}},
	}
	for i, s := range steps {
		if s.prep != nil {
			s.prep()
		}
		got := keys(idle.Expired(c.Entries(), t0.Add(s.at), ttl))
		slices.Sort(got)
		if diff := cmp.Diff(s.want, got); diff != "" {
			t.Errorf("step %d at %v: expired (-want +got):\n%s", i, s.at, diff)
		}
	}
	// Dropped entries are forgotten.
	for _, e := range []*Entry{zero, busy, held, long, gone} {
		c.Drop(e, false)
	}
	idle.Expired(c.Entries(), t0.Add(4*ttl), ttl)
	if len(idle.seen) != 0 {
		t.Errorf("Idle still tracks %d dropped entries", len(idle.seen))
	}
}
