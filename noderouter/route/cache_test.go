package route

import (
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var fn = Ref{"default", "echo"}

func infos(uids ...string) []InstanceInfo {
	out := make([]InstanceInfo, len(uids))
	for i, u := range uids {
		out[i] = InstanceInfo{Pod: "pod-" + u, PodUID: u, Address: "198.18.1." + u + ":8080", Node: "node1"}
	}
	return out
}

func uids(a *Assignment) []string {
	if a == nil {
		return nil
	}
	out := []string{}
	for _, in := range a.Instances {
		out = append(out, in.PodUID)
	}
	return out
}

func TestCache(t *testing.T) {
	type step struct {
		op      string // store, evict, remove
		gen     uint64
		uids    []string
		wantApp bool
		wantGen uint64
		want    []string // uids held afterwards; nil: no assignment
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first store", []step{
			{op: "store", gen: 1, uids: []string{"1", "2"}, wantApp: true, wantGen: 1, want: []string{"1", "2"}},
		}},
		{"newer replaces, stale ignored", []step{
			{op: "store", gen: 2, uids: []string{"1"}, wantApp: true, wantGen: 2, want: []string{"1"}},
			{op: "store", gen: 1, uids: []string{"1", "2"}, wantApp: false, wantGen: 2, want: []string{"1"}},
			{op: "store", gen: 2, uids: []string{"1", "2"}, wantApp: false, wantGen: 2, want: []string{"1"}},
			{op: "store", gen: 3, uids: []string{"2", "3"}, wantApp: true, wantGen: 3, want: []string{"2", "3"}},
		}},
		{"evict keeps generation", []step{
			{op: "store", gen: 5, uids: []string{"1", "2"}, wantApp: true, wantGen: 5, want: []string{"1", "2"}},
			{op: "evict", uids: []string{"1"}, wantApp: true, wantGen: 5, want: []string{"2"}},
			{op: "evict", uids: []string{"9"}, wantApp: false, wantGen: 5, want: []string{"2"}},
			{op: "evict", uids: []string{"2"}, wantApp: true, wantGen: 5, want: []string{}},
			// Same generation refills an empty set, minus what was evicted.
			{op: "store", gen: 5, uids: []string{"1", "2", "3"}, wantApp: true, wantGen: 5, want: []string{"3"}},
			{op: "store", gen: 6, uids: []string{"1", "2"}, wantApp: true, wantGen: 6, want: []string{"1", "2"}},
		}},
		{"remove", []step{
			{op: "store", gen: 4, uids: []string{"1"}, wantApp: true, wantGen: 4, want: []string{"1"}},
			{op: "remove", gen: 3, wantGen: 4, want: []string{"1"}},
			{op: "remove", gen: 4, wantGen: 0, want: nil},
			{op: "store", gen: 1, uids: []string{"2"}, wantApp: true, wantGen: 1, want: []string{"2"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Cache
			for i, s := range tt.steps {
				var applied bool
				var gen uint64
				switch s.op {
				case "store":
					_, a, ok := c.Store(fn, Update{Generation: s.gen, Instances: infos(s.uids...)})
					applied, gen = ok, a.Generation
				case "evict":
					applied = c.Evict(fn, s.uids[0])
					_, a := c.Lookup(fn)
					gen = a.Generation
				case "remove":
					gen = c.Remove(fn, s.gen)
				}
				if applied != s.wantApp || gen != s.wantGen {
					t.Errorf("step %d %s: applied, gen = %v, %d; want %v, %d", i, s.op, applied, gen, s.wantApp, s.wantGen)
				}
				_, a := c.Lookup(fn)
				if diff := cmp.Diff(s.want, uids(a)); diff != "" {
					t.Errorf("step %d %s: instances (-want +got):\n%s", i, s.op, diff)
				}
			}
		})
	}
}

func TestStoreKeepsInstances(t *testing.T) {
	var c Cache
	_, a1, _ := c.Store(fn, Update{Generation: 1, Instances: infos("1", "2")})
	a1.Instances[0].InFlight.Add(3)
	_, a2, _ := c.Store(fn, Update{Generation: 2, Instances: infos("1", "3")})
	if a2.Instances[0] != a1.Instances[0] {
		t.Errorf("instance 1 was replaced by a new object across generations")
	}
	if got := a2.Instances[0].InFlight.Load(); got != 3 {
		t.Errorf("in-flight of instance 1 = %d, want 3", got)
	}
}

func TestLookupMissAndEntries(t *testing.T) {
	var c Cache
	if e, a := c.Lookup(fn); e != nil || a != nil {
		t.Fatalf("empty cache: %v %v", e, a)
	}
	c.Store(fn, Update{Generation: 1, Instances: infos("1")})
	c.Store(Ref{"other", "fn"}, Update{Generation: 1})
	if e, a := c.Lookup(Ref{"default", "nope"}); e != nil || a != nil {
		t.Fatalf("unknown function: %v %v", e, a)
	}
	if got := len(c.Entries()); got != 2 {
		t.Errorf("entries = %d, want 2", got)
	}
	e, _ := c.Lookup(fn)
	if e.Key != "default/echo" {
		t.Errorf("key = %q", e.Key)
	}
}

func BenchmarkLookup(b *testing.B) {
	var c Cache
	for i := range 1000 {
		c.Store(Ref{"ns", "fn-" + string(rune('a'+i%26)) + repeat('x', i%7)}, Update{Generation: 1, Instances: infos("1")})
	}
	c.Store(fn, Update{Generation: 1, Instances: infos("1", "2", "3")})
	b.ReportAllocs()
	for b.Loop() {
		e, a := c.Lookup(fn)
		if a == nil {
			b.Fatal("miss")
		}
		in := a.Acquire(rand.Uint64(), 0, nil)
		if in == nil {
			b.Fatal("no instance")
		}
		e.Release(in)
	}
}
