package dataplane

import (
	"slices"
	"testing"
	"time"
)

// fakeIdle is a connection as an idleShard sees it.
type fakeIdle struct {
	name  string
	since time.Time
}

func (c *fakeIdle) idleSince() time.Time { return c.since }

// TestIdleShard: last in first out per address, expired connections
// dropped oldest first by take and sweep, the per-address bound, remove,
// and the count kept through all of it.
func TestIdleShard(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	const ttl = 10 * time.Second
	conn := func(name string, idleAt time.Duration) *fakeIdle { return &fakeIdle{name, t0.Add(idleAt)} }
	names := func(cs []*fakeIdle) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.name)
		}
		return out
	}
	type op struct {
		put    *fakeIdle // put for its addr ("a" unless named b*)
		take   string    // take for this addr
		remove *fakeIdle
		sweep  bool
		all    bool
		at     time.Duration // now, for take and sweep
		// want
		kept    bool     // put's result
		got     string   // take's connection ("" none)
		removed bool     // remove's result
		dropped []string // what drop got, in order
		n       int      // len after
		countA  int      // count("a") after
	}
	a1, a2, a3, b1 := conn("a1", 0), conn("a2", time.Second), conn("a3", 2*time.Second), conn("b1", 5*time.Second)
	addrOf := func(c *fakeIdle) string { return c.name[:1] }
	rows := []struct {
		name string
		max  int
		ops  []op
	}{
		{"last in, first out", 3, []op{
			{put: a1, kept: true, n: 1, countA: 1},
			{put: a2, kept: true, n: 2, countA: 2},
			{put: b1, kept: true, n: 3, countA: 2},
			{take: "a", at: 3 * time.Second, got: "a2", n: 2, countA: 1},
			{take: "a", at: 3 * time.Second, got: "a1", n: 1, countA: 0},
			{take: "a", at: 3 * time.Second, got: "", n: 1, countA: 0},
		}},
		{"the bound per address", 2, []op{
			{put: a1, kept: true, n: 1, countA: 1},
			{put: a2, kept: true, n: 2, countA: 2},
			{put: a3, kept: false, n: 2, countA: 2},
			{put: b1, kept: true, n: 3, countA: 2},
		}},
		{"take drops the expired it meets", 3, []op{
			{put: a1, kept: true, n: 1, countA: 1},
			{put: a2, kept: true, n: 2, countA: 2},
			{put: a3, kept: true, n: 3, countA: 3},
			// a3 idle 9.5 s: young; a2 10.5 s and a1 11.5 s: old.
			{take: "a", at: 11500 * time.Millisecond, got: "a3", n: 2, countA: 2},
			{take: "a", at: 11500 * time.Millisecond, got: "", dropped: []string{"a2", "a1"}, n: 0, countA: 0},
		}},
		{"sweep drops the old, oldest first, and keeps the rest", 3, []op{
			{put: a1, kept: true, n: 1, countA: 1},
			{put: a2, kept: true, n: 2, countA: 2},
			{put: a3, kept: true, n: 3, countA: 3},
			{put: b1, kept: true, n: 4, countA: 3},
			{sweep: true, at: 11 * time.Second, dropped: []string{"a1", "a2"}, n: 2, countA: 1},
			{take: "a", at: 11 * time.Second, got: "a3", n: 1, countA: 0},
			{sweep: true, all: true, dropped: []string{"b1"}, n: 0, countA: 0},
		}},
		{"remove", 3, []op{
			{put: a1, kept: true, n: 1, countA: 1},
			{put: a2, kept: true, n: 2, countA: 2},
			{put: a3, kept: true, n: 3, countA: 3},
			{remove: a2, removed: true, n: 2, countA: 2},
			{remove: a2, removed: false, n: 2, countA: 2},
			{remove: b1, removed: false, n: 2, countA: 2},
			{take: "a", at: 3 * time.Second, got: "a3", n: 1, countA: 1},
			{take: "a", at: 3 * time.Second, got: "a1", n: 0, countA: 0},
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var s idleShard[*fakeIdle]
			for i, o := range row.ops {
				var dropped []*fakeIdle
				drop := func(c *fakeIdle) {
					if s.count(addrOf(c)) > 0 && slices.Contains(s.by[addrOf(c)], c) {
						t.Errorf("op %d: %s dropped while still held", i, c.name)
					}
					dropped = append(dropped, c)
				}
				now := t0.Add(o.at)
				switch {
				case o.put != nil:
					if kept := s.put(addrOf(o.put), o.put, row.max); kept != o.kept {
						t.Errorf("op %d: put %s kept %v, want %v", i, o.put.name, kept, o.kept)
					}
				case o.take != "":
					c, ok := s.take(o.take, now, ttl, drop)
					got := ""
					if ok {
						got = c.name
					}
					if got != o.got {
						t.Errorf("op %d: take %s got %q, want %q", i, o.take, got, o.got)
					}
					if list, kept := s.by[o.take]; ok && len(list) == 0 && (!kept || cap(list) == 0) {
						t.Errorf("op %d: take emptied %s's list and let its array go (the next put allocates)", i, o.take)
					}
				case o.remove != nil:
					if r := s.remove(addrOf(o.remove), o.remove); r != o.removed {
						t.Errorf("op %d: remove %s = %v, want %v", i, o.remove.name, r, o.removed)
					}
				case o.sweep:
					s.sweep(now, ttl, o.all, drop)
				}
				if got := names(dropped); !slices.Equal(got, o.dropped) {
					t.Errorf("op %d: dropped %v, want %v", i, got, o.dropped)
				}
				if s.len() != o.n || s.count("a") != o.countA {
					t.Errorf("op %d: len %d, count(a) %d; want %d, %d", i, s.len(), s.count("a"), o.n, o.countA)
				}
			}
			// Emptied lists stay for the next put; a sweep deletes them.
			s.sweep(t0.Add(time.Hour), ttl, false, func(*fakeIdle) {})
			if s.len() == 0 && len(s.by) != 0 {
				t.Errorf("a swept empty shard keeps addresses: %v", s.by)
			}
		})
	}
}
