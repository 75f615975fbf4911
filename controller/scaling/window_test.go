package scaling

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const hbTimeout = 3 * time.Second

var (
	rA  = RouterID{Pod: "skipper-system/router-a", Incarnation: "a1"}
	rA2 = RouterID{Pod: "skipper-system/router-a", Incarnation: "a2"}
	rB  = RouterID{Pod: "skipper-system/router-b", Incarnation: "b1"}
)

// event is one report received at t0+at (the router sent it at the same
// instant unless sent is set).
type event struct {
	at       time.Duration
	router   RouterID
	seq      uint64
	sent     time.Duration
	inFlight int64
	queued   int64
	requests uint64
	insts    []InstanceReport
}

func (e event) report() Report {
	sent := e.at
	if e.sent != 0 {
		sent = e.sent
	}
	return Report{
		Router: e.router, Sequence: e.seq, Sent: t0.Add(sent),
		InFlight: e.inFlight, Queued: e.queued, Counters: Counters{Requests: e.requests}, Instances: e.insts,
	}
}

func TestWindow(t *testing.T) {
	t.Parallel()
	type result struct {
		Accepted   []bool
		Deltas     []uint64
		Load       Load
		Total      uint64
		LastActive time.Duration // since t0; -1 if never
	}
	tests := []struct {
		name   string
		events []event
		now    time.Duration
		want   result
	}{
		{
			name:   "gauges: the latest report of a router wins",
			events: []event{{at: 0, router: rA, seq: 1, inFlight: 5, queued: 2}, {at: time.Second, router: rA, seq: 2, inFlight: 1}},
			now:    time.Second,
			want:   result{Accepted: []bool{true, true}, Deltas: []uint64{0, 0}, Load: Load{InFlight: 1, Routers: 1}, LastActive: time.Second},
		},
		{
			name:   "gauges sum across routers",
			events: []event{{at: 0, router: rA, seq: 1, inFlight: 5, queued: 1}, {at: 0, router: rB, seq: 7, inFlight: 3, queued: 2}},
			want:   result{Accepted: []bool{true, true}, Deltas: []uint64{0, 0}, Load: Load{InFlight: 8, Queued: 3, Routers: 2}, LastActive: 0},
		},
		{
			name:   "the first report of an incarnation is a baseline; later ones add deltas",
			events: []event{{at: 0, router: rA, seq: 4, requests: 100}, {at: time.Second, router: rA, seq: 5, requests: 130}},
			now:    time.Second,
			want:   result{Accepted: []bool{true, true}, Deltas: []uint64{0, 30}, Load: Load{Routers: 1}, Total: 30, LastActive: time.Second},
		},
		{
			name: "a repeated report never double-counts",
			events: []event{
				{at: 0, router: rA, seq: 1, requests: 10}, {at: time.Second, router: rA, seq: 2, requests: 15},
				{at: time.Second, router: rA, seq: 2, requests: 15},
			},
			now:  time.Second,
			want: result{Accepted: []bool{true, true, false}, Deltas: []uint64{0, 5, 0}, Load: Load{Routers: 1}, Total: 5, LastActive: time.Second},
		},
		{
			name: "a lost report's counts arrive with the next",
			events: []event{
				{at: 0, router: rA, seq: 1, requests: 10}, {at: 2 * time.Second, router: rA, seq: 3, requests: 25},
			},
			now:  2 * time.Second,
			want: result{Accepted: []bool{true, true}, Deltas: []uint64{0, 15}, Load: Load{Routers: 1}, Total: 15, LastActive: 2 * time.Second},
		},
		{
			name: "a reordered older report is dropped and its gauges ignored",
			events: []event{
				{at: 0, router: rA, seq: 1, requests: 10}, {at: time.Second, router: rA, seq: 3, requests: 25, inFlight: 1},
				{at: 1100 * time.Millisecond, router: rA, seq: 2, requests: 20, inFlight: 9},
			},
			now:  time.Second,
			want: result{Accepted: []bool{true, true, false}, Deltas: []uint64{0, 15, 0}, Load: Load{InFlight: 1, Routers: 1}, Total: 15, LastActive: time.Second},
		},
		{
			name: "a new incarnation restarts from a baseline",
			events: []event{
				{at: 0, router: rA, seq: 8, requests: 500}, {at: time.Second, router: rA, seq: 9, requests: 510},
				{at: 2 * time.Second, router: rA2, seq: 1, requests: 3}, {at: 3 * time.Second, router: rA2, seq: 2, requests: 7},
			},
			now:  3 * time.Second,
			want: result{Accepted: []bool{true, true, true, true}, Deltas: []uint64{0, 10, 0, 4}, Load: Load{Routers: 1}, Total: 14, LastActive: 3 * time.Second},
		},
		{
			name: "a late report of the old incarnation is dropped",
			events: []event{
				{at: 0, router: rA, seq: 8, requests: 500},
				{at: time.Second, router: rA2, seq: 1, requests: 3, inFlight: 2},
				{at: 1100 * time.Millisecond, sent: 500 * time.Millisecond, router: rA, seq: 9, requests: 900, inFlight: 40},
			},
			now:  time.Second,
			want: result{Accepted: []bool{true, true, false}, Deltas: []uint64{0, 0, 0}, Load: Load{InFlight: 2, Routers: 1}, LastActive: time.Second},
		},
		{
			name: "a router silent for the heartbeat timeout counts as zero",
			events: []event{
				{at: 0, router: rA, seq: 1, inFlight: 50}, {at: 2 * time.Second, router: rB, seq: 1, inFlight: 4},
			},
			now:  hbTimeout,
			want: result{Accepted: []bool{true, true}, Deltas: []uint64{0, 0}, Load: Load{InFlight: 4, Routers: 1}, LastActive: 2 * time.Second},
		},
		{
			name:   "a counter going down within an incarnation reads as a reset",
			events: []event{{at: 0, router: rA, seq: 1, requests: 100}, {at: time.Second, router: rA, seq: 2, requests: 4}},
			now:    time.Second,
			want:   result{Accepted: []bool{true, true}, Deltas: []uint64{0, 4}, Load: Load{Routers: 1}, Total: 4, LastActive: time.Second},
		},
		{
			name:   "reports without load or new requests leave the function inactive",
			events: []event{{at: 0, router: rA, seq: 1, requests: 100}, {at: time.Second, router: rA, seq: 2, requests: 100}},
			now:    time.Second,
			want:   result{Accepted: []bool{true, true}, Deltas: []uint64{0, 0}, Load: Load{Routers: 1}, LastActive: -1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWindow(t0)
			var got result
			for _, e := range tt.events {
				d, ok := w.Observe(t0.Add(e.at), e.report())
				got.Accepted = append(got.Accepted, ok)
				got.Deltas = append(got.Deltas, d.Requests)
			}
			now := t0.Add(tt.now)
			got.Load = w.Load(now, hbTimeout)
			got.Total = w.Totals().Requests
			got.LastActive = -1
			if la := w.LastActive(); !la.IsZero() {
				got.LastActive = la.Sub(t0)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWindowFill(t *testing.T) {
	t.Parallel()
	w := NewWindow(t0)
	w.Observe(t0, Report{Router: rA, Sequence: 1, Sent: t0, Instances: []InstanceReport{
		{PodUID: "u1", InFlight: 2, CPUMilli: 150, HasCPU: true, MemoryBytes: 64 << 20, HasMemory: true}, // u1 runs on a's node
		{PodUID: "u2", InFlight: 1},
	}})
	w.Observe(t0.Add(time.Second), Report{Router: rB, Sequence: 1, Sent: t0.Add(time.Second), Instances: []InstanceReport{
		{PodUID: "u1", InFlight: 3},
		{PodUID: "u2", InFlight: 4, CPUMilli: 80, HasCPU: true}, // u2 runs on b's node
	}})
	w.Observe(t0.Add(-time.Minute), Report{Router: RouterID{Pod: "c", Incarnation: "c1"}, Sequence: 1, Sent: t0, Instances: []InstanceReport{
		{PodUID: "u1", InFlight: 100, CPUMilli: 9999, HasCPU: true}, // silent since: ignored
	}})
	now := t0.Add(time.Second)
	fill := func(uid string) Instance {
		inst := Instance{Ready: true, InFlight: 77, CPUMilli: 1, HasCPU: true} // stale values are replaced
		w.Fill(now, hbTimeout, uid, &inst)
		return inst
	}
	got := []Instance{fill("u1"), fill("u2"), fill("u3")}
	want := []Instance{
		{Ready: true, InFlight: 5, CPUMilli: 150, HasCPU: true, MemoryBytes: 64 << 20, HasMemory: true},
		{Ready: true, InFlight: 5, CPUMilli: 80, HasCPU: true},
		{Ready: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Fill mismatch (-want +got):\n%s", diff)
	}
}

func TestWindowPruneAndWarmUp(t *testing.T) {
	t.Parallel()
	w := NewWindow(t0)
	if w.WarmedUp(t0.Add(2*time.Second), hbTimeout) {
		t.Error("WarmedUp before one heartbeat window")
	}
	if !w.WarmedUp(t0.Add(hbTimeout), hbTimeout) {
		t.Error("not WarmedUp after one heartbeat window")
	}
	w.Observe(t0, Report{Router: rA, Sequence: 1, Sent: t0, Counters: Counters{Requests: 10}})
	w.Observe(t0.Add(time.Second), Report{Router: rB, Sequence: 1, Sent: t0, Counters: Counters{Requests: 10}})
	w.Prune(t0.Add(hbTimeout), hbTimeout)
	if got := w.Routers(); got != 1 {
		t.Fatalf("Routers() after Prune = %d, want 1", got)
	}
	// rA comes back with the same incarnation: a new baseline, nothing from
	// its silence is counted.
	d, ok := w.Observe(t0.Add(10*time.Second), Report{Router: rA, Sequence: 9, Sent: t0.Add(10 * time.Second), Counters: Counters{Requests: 90}})
	if diff := cmp.Diff(struct {
		D  Counters
		OK bool
	}{Counters{}, true}, struct {
		D  Counters
		OK bool
	}{d, ok}); diff != "" {
		t.Errorf("Observe after Prune (-want +got):\n%s", diff)
	}
	w.Touch(t0.Add(20 * time.Second))
	w.Touch(t0.Add(15 * time.Second)) // never moves back
	if got, want := w.LastActive(), t0.Add(20*time.Second); !got.Equal(want) {
		t.Errorf("LastActive() = %v, want %v", got, want)
	}
}

func TestWindowReported(t *testing.T) {
	t.Parallel()
	w := NewWindow(t0)
	w.Observe(t0, Report{Router: rA, Sequence: 1, Sent: t0, Instances: []InstanceReport{{PodUID: "u2"}, {PodUID: "u1"}}})
	w.Observe(t0.Add(time.Second), Report{Router: rB, Sequence: 1, Sent: t0, Instances: []InstanceReport{{PodUID: "u1"}, {PodUID: "u3"}}})
	if diff := cmp.Diff([]string{"u1", "u2", "u3"}, w.Reported(t0.Add(time.Second), hbTimeout, nil)); diff != "" {
		t.Errorf("Reported (-want +got):\n%s", diff)
	}
	// rA goes silent: its instances are no longer reported; dst is kept.
	if diff := cmp.Diff([]string{"x", "u1", "u3"}, w.Reported(t0.Add(hbTimeout), hbTimeout, []string{"x"})); diff != "" {
		t.Errorf("Reported after rA's silence (-want +got):\n%s", diff)
	}
}

// FuzzWindow delivers each router incarnation's reports (router a's second
// incarnation starting once a1 stops) with losses, repeats and reordering and checks that the counted requests never exceed
// what the accepted reports prove happened, and equal it when delivery is in
// order.
func FuzzWindow(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0x10, 0x21, 0x10, 0x33, 0x40, 0x05, 0xff, 0x80, 0x81})
	f.Fuzz(func(t *testing.T, ops []byte) {
		type inc struct {
			id       RouterID
			seq      uint64
			requests uint64
			sent     []Report
		}
		incs := []*inc{{id: rA}, {id: rB}, {id: rA2}}
		w := NewWindow(t0)
		now := t0
		inOrder, retired := true, false
		lo := map[RouterID]uint64{} // lowest accepted cumulative per incarnation
		hi := map[RouterID]uint64{} // highest accepted cumulative per incarnation
		for _, op := range ops {
			now = now.Add(100 * time.Millisecond)
			in := incs[int(op&0x3)%len(incs)]
			if in.id == rA2 {
				retired = true // incarnations of one pod follow each other
			}
			var r Report
			switch {
			case (op&0xc0 == 0xc0 || (retired && in.id == rA)) && len(in.sent) > 0: // repeat or reorder an old report
				r = in.sent[int(op>>2)%len(in.sent)]
				inOrder = false
			case retired && in.id == rA:
				continue // a2 replaced a1, which sends nothing new
			default:
				in.seq++
				in.requests += uint64(op >> 4)
				r = Report{Router: in.id, Sequence: in.seq, Sent: now, Counters: Counters{Requests: in.requests}}
				in.sent = append(in.sent, r)
				if op&0xc0 == 0x80 { // lost
					continue
				}
			}
			before := w.Totals().Requests
			d, ok := w.Observe(now, r)
			if w.Totals().Requests != before+d.Requests {
				t.Fatalf("Totals moved by %d, delta said %d", w.Totals().Requests-before, d.Requests)
			}
			if !ok {
				if d != (Counters{}) {
					t.Fatalf("rejected report returned delta %+v", d)
				}
				continue
			}
			c := r.Counters.Requests
			if _, seen := lo[r.Router]; !seen {
				lo[r.Router] = c
			}
			hi[r.Router] = max(hi[r.Router], c)
		}
		var proven uint64
		for id := range hi {
			proven += hi[id] - lo[id]
		}
		got := w.Totals().Requests
		// Incarnations of the same pod replace each other, each restarting
		// from a baseline, so the total is at most what the accepted
		// reports prove.
		if got > proven {
			t.Fatalf("counted %d requests, accepted reports prove only %d", got, proven)
		}
		if inOrder && got != proven {
			t.Fatalf("in-order delivery counted %d requests, want %d", got, proven)
		}
	})
}
