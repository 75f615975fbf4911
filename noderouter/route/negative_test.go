package route

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
)

func TestNegative(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	a, b, c := Ref{"default", "a"}, Ref{"default", "b"}, Ref{"team", "c"}
	type step struct {
		op   string // add, has
		ref  Ref
		at   int  // ms after t0
		want bool // for has
	}
	tests := []struct {
		name    string
		ttl     time.Duration
		max     int
		steps   []step
		wantLen int
	}{
		{"remembered for the TTL", time.Second, 10, []step{
			{op: "has", ref: a, at: 0, want: false},
			{op: "add", ref: a, at: 0},
			{op: "has", ref: a, at: 0, want: true},
			{op: "has", ref: a, at: 999, want: true},
			{op: "has", ref: a, at: 1000, want: false},
			{op: "has", ref: b, at: 10, want: false},
		}, 1},
		{"re-adding extends", time.Second, 10, []step{
			{op: "add", ref: a, at: 0},
			{op: "add", ref: a, at: 900},
			{op: "has", ref: a, at: 1500, want: true},
			{op: "has", ref: a, at: 1900, want: false},
		}, 1},
		{"full evicts the oldest", time.Second, 2, []step{
			{op: "add", ref: a, at: 0},
			{op: "add", ref: b, at: 1},
			{op: "add", ref: c, at: 2},
			{op: "has", ref: a, at: 3, want: false},
			{op: "has", ref: b, at: 3, want: true},
			{op: "has", ref: c, at: 3, want: true},
		}, 2},
		{"a superseded item leaving does not forget the name", time.Second, 2, []step{
			{op: "add", ref: a, at: 0},
			{op: "add", ref: a, at: 100}, // the ring now holds a@0 (superseded) and a@100
			{op: "add", ref: b, at: 200}, // full: a@0 leaves; a stays
			{op: "has", ref: a, at: 300, want: true},
			{op: "has", ref: b, at: 300, want: true},
		}, 2},
		{"expired names are dropped on add", time.Second, 10, []step{
			{op: "add", ref: a, at: 0},
			{op: "add", ref: b, at: 500},
			{op: "add", ref: c, at: 1200}, // a expired at 1000
		}, 2},
		{"zero TTL remembers nothing", 0, 10, []step{
			{op: "add", ref: a, at: 0},
			{op: "has", ref: a, at: 0, want: false},
		}, 0},
		{"zero size remembers nothing", time.Second, 0, []step{
			{op: "add", ref: a, at: 0},
			{op: "has", ref: a, at: 0, want: false},
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := NewNegative(tt.ttl, tt.max)
			for i, s := range tt.steps {
				switch s.op {
				case "add":
					n.Add(s.ref, at(s.at))
				case "has":
					if got := n.Contains(s.ref, at(s.at)); got != s.want {
						t.Errorf("step %d: Contains(%v) at %dms = %v, want %v", i, s.ref, s.at, got, s.want)
					}
				}
			}
			if got := n.Len(); got != tt.wantLen {
				t.Errorf("Len = %d, want %d", got, tt.wantLen)
			}
		})
	}
}

// TestNegativeBounded floods the cache with unique names: it never holds
// more than max, and holds the newest.
func TestNegativeBounded(t *testing.T) {
	const max = 100
	n := NewNegative(time.Second, max)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var last []Ref
	for i := range 10 * max {
		r := Ref{"default", fmt.Sprintf("fn-%d", i)}
		n.Add(r, now)
		if i >= 9*max {
			last = append(last, r)
		}
		if got := n.Len(); got > max {
			t.Fatalf("after %d adds Len = %d > %d", i+1, got, max)
		}
	}
	var missing []Ref
	for _, r := range last {
		if !n.Contains(r, now) {
			missing = append(missing, r)
		}
	}
	if diff := cmp.Diff([]Ref(nil), missing); diff != "" {
		t.Errorf("the newest %d names are not all remembered (-want +got):\n%s", max, diff)
	}
}

// TestNegativeCopiesNames checks that a remembered name does not alias the
// caller's string (a substring of a request header).
func TestNegativeCopiesNames(t *testing.T) {
	hdr := strings.Clone("default/echo")
	r := Ref{Namespace: hdr[:7], Name: hdr[8:]}
	n := NewNegative(time.Second, 1)
	n.Add(r, time.Now())
	for k := range n.exp {
		if unsafe.StringData(k.Name) == unsafe.StringData(r.Name) {
			t.Error("the cache keeps the caller's string")
		}
	}
}

// BenchmarkNegativeContains is the cost of answering a flood of requests
// for an unknown name.
func BenchmarkNegativeContains(b *testing.B) {
	n := NewNegative(time.Second, 10000)
	now := time.Now()
	for i := range 10000 {
		n.Add(Ref{"default", fmt.Sprintf("fn-%d", i)}, now)
	}
	r := Ref{"default", "fn-9999"}
	b.ReportAllocs()
	for b.Loop() {
		if !n.Contains(r, now) {
			b.Fatal("forgotten")
		}
	}
}
