package scaling

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestHistory(t *testing.T) {
	t.Parallel()
	const w = 100 * time.Second
	type step struct {
		at          time.Duration // after t0
		rec         int32
		wantHighest int32
	}
	tests := []struct {
		name    string
		steps   []step
		wantLen int
	}{
		{
			name:    "empty window returns the recommendation",
			steps:   []step{{0, 3, 3}},
			wantLen: 1,
		},
		{
			name:    "a higher recommendation holds until it leaves the window",
			steps:   []step{{0, 5, 5}, {10 * time.Second, 2, 5}, {99 * time.Second, 2, 5}, {100 * time.Second, 2, 2}},
			wantLen: 1,
		},
		{
			name:    "steps down one entry at a time",
			steps:   []step{{0, 5, 5}, {10 * time.Second, 4, 5}, {20 * time.Second, 3, 5}, {105 * time.Second, 1, 4}, {115 * time.Second, 1, 3}, {125 * time.Second, 1, 1}},
			wantLen: 1,
		},
		{
			name:    "a later equal or higher recommendation replaces earlier ones",
			steps:   []step{{0, 5, 5}, {10 * time.Second, 3, 5}, {20 * time.Second, 6, 6}, {110 * time.Second, 1, 6}, {120 * time.Second, 1, 1}},
			wantLen: 1,
		},
		{
			name:    "a clock going backwards never shortens the window",
			steps:   []step{{50 * time.Second, 5, 5}, {0, 2, 5}, {140 * time.Second, 1, 5}, {150 * time.Second, 1, 1}},
			wantLen: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h History
			var got, want []int32
			for _, s := range tt.steps {
				got = append(got, h.record(t0.Add(s.at), s.rec, w))
				want = append(want, s.wantHighest)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("highest per step (-want +got):\n%s", diff)
			}
			last := tt.steps[len(tt.steps)-1]
			if hi, ok := h.Highest(t0.Add(last.at), w); !ok || hi != last.wantHighest {
				t.Errorf("Highest() = %d, %v; want %d, true", hi, ok, last.wantHighest)
			}
			if h.Len() != tt.wantLen {
				t.Errorf("Len() = %d, want %d", h.Len(), tt.wantLen)
			}
		})
	}
}

// TestHistoryBounded checks, against an unbounded reference, that the
// bounded History never reports less than the true highest recommendation
// in the window (it may hold longer, never release earlier) and is exact
// while fewer than historySize descending steps share a window.
func TestHistoryBounded(t *testing.T) {
	t.Parallel()
	const w = 60 * time.Second
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 200 {
		var h History
		type e struct {
			at  time.Time
			rec int32
		}
		var all []e
		now := t0
		descending := run%2 == 0 // half the runs stress the bound
		rec := int32(1000)
		for range 500 {
			now = now.Add(time.Duration(1+rng.IntN(5)) * time.Second)
			if descending {
				rec -= int32(rng.IntN(3))
			} else {
				rec = int32(rng.IntN(20))
			}
			got := h.record(now, rec, w)
			all = append(all, e{now, rec})
			want := rec
			for _, x := range all {
				if x.at.After(now.Add(-w)) {
					want = max(want, x.rec)
				}
			}
			if h.Len() > historySize {
				t.Fatalf("run %d: Len() = %d > %d", run, h.Len(), historySize)
			}
			if got < want {
				t.Fatalf("run %d at %v: highest %d < true %d (released early)", run, now.Sub(t0), got, want)
			}
			if !descending && got != want {
				t.Fatalf("run %d at %v: highest %d, want exactly %d", run, now.Sub(t0), got, want)
			}
		}
	}
}
