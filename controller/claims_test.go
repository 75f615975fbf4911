package controller

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// uids returns the pods' UIDs, in order.
func uids(ps []*corev1.Pod) []types.UID {
	var out []types.UID
	for _, p := range ps {
		out = append(out, p.UID)
	}
	return out
}

// metricValue is the value of a gauge or a counter.
func metricValue(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if g := d.GetGauge(); g != nil {
		return g.GetValue()
	}
	return d.GetCounter().GetValue()
}

// TestClaimsAssumed: a claim stays assumed until the informer shows it
// recorded, or assumedTTL passes; one whose record is still being written
// stays past the TTL (an API server outage); once it lands, the TTL runs
// from then (the informer may lag after the outage); a pod gone or
// another's before its record leaves the set and is retired.
func TestClaimsAssumed(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	key := fn.Key()
	p := claimedCopy(testPod("p"), fn, claimInfo{At: t0})
	late := t0.Add(assumedTTL + time.Minute)
	for _, tt := range []struct {
		name      string
		recording bool
		ended     recordState // recordNeeded: the record's writer has not ended
		endedAt   time.Time
		cached    []*corev1.Pod
		at        time.Time
		want      []types.UID
		retired   bool
		lag       time.Duration // lastLag after the read
	}{
		{name: "not shown yet", at: t0.Add(time.Second), want: []types.UID{p.UID}},
		{name: "shown assign-pending", cached: []*corev1.Pod{testPod("p", annotated(annAssignPending, "x"))}, at: t0.Add(time.Second), want: []types.UID{p.UID}},
		{name: "shown recorded", cached: []*corev1.Pod{p}, at: t0.Add(3 * time.Second), lag: 3 * time.Second},
		{name: "past the TTL", at: late},
		{name: "past the TTL while recording", recording: true, at: late, want: []types.UID{p.UID}},
		{name: "half a TTL after the record landed", recording: true, ended: recordDone, endedAt: late, at: late.Add(assumedTTL / 2), want: []types.UID{p.UID}},
		{name: "a TTL after the record landed", recording: true, ended: recordDone, endedAt: late, at: late.Add(assumedTTL + time.Second)},
		{name: "gone before its record", recording: true, ended: recordPodGone, endedAt: t0, at: t0, retired: true},
		{name: "another's before its record", recording: true, ended: recordForeign, endedAt: t0, at: t0, retired: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "unrecorded"})
			cl := newClaims(nil, gauge)
			cl.land(key, cl.start(key, flightScale), p, t0)
			if tt.recording && !cl.startRecording(p.UID) {
				t.Fatal("startRecording = false for a pod not being recorded")
			}
			if tt.recording && cl.startRecording(p.UID) {
				t.Error("startRecording = true twice")
			}
			if got := metricValue(t, gauge); tt.recording && got != 1 {
				t.Errorf("unrecorded gauge %v while recording, want 1", got)
			}
			if tt.ended != recordNeeded {
				cl.recordEnded(key, p.UID, tt.ended, tt.endedAt)
				if got := metricValue(t, gauge); got != 0 {
					t.Errorf("unrecorded gauge %v after the record ended, want 0", got)
				}
			}
			if diff := cmp.Diff(tt.want, uids(cl.assumedPods(key, tt.cached, tt.at))); diff != "" {
				t.Errorf("assumed (-want +got):\n%s", diff)
			}
			if got := slices.Contains(cl.retiredUIDs(tt.at), string(p.UID)); got != tt.retired {
				t.Errorf("retired = %v, want %v", got, tt.retired)
			}
			if tt.lag != 0 && cl.lag(tt.at) != tt.lag {
				t.Errorf("lag = %v, want %v", cl.lag(tt.at), tt.lag)
			}
		})
	}
}

// TestClaimsJoin: callers for a function share the claim in flight; a new
// one starts only when none is and admit lets it; a landed flight leaves
// the claimed pod assumed and unreserved.
func TestClaimsJoin(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	key := fn.Key()
	cl := newClaims(nil, nil)
	refuse := errors.New("rate limited")
	if _, leader, err := cl.join(key, func() error { return refuse }); !errors.Is(err, refuse) || leader {
		t.Fatalf("join refused by admit = %v, leader %v; want the admit error", err, leader)
	}
	if n := cl.inFlight(); n != 0 {
		t.Fatalf("%d flights after a refused join, want 0", n)
	}
	f, leader, err := cl.join(key, nil)
	if err != nil || !leader || f.kind != flightCold {
		t.Fatalf("first join = %v, leader %v, kind %v; want a cold flight led", err, leader, f.kind)
	}
	g, leader, err := cl.join(key, func() error { return refuse })
	if err != nil || leader || g != f {
		t.Fatalf("second join = %v, leader %v, same flight %v; want the first one, admit not asked", err, leader, g == f)
	}
	if n := cl.flying("default/other"); n != 0 {
		t.Errorf("another function has %d flights", n)
	}
	pool := []*corev1.Pod{testPod("p1")}
	p := cl.reserve(fn, pool, "", nil, t0)
	if p == nil {
		t.Fatal("no pod reserved")
	}
	cl.land(key, f, claimedCopy(p, fn, claimInfo{At: t0}), t0)
	if n := cl.flying(key); n != 0 {
		t.Errorf("%d flights after the landing, want 0", n)
	}
	if cl.reserved[p.UID] {
		t.Error("still reserved after the landing")
	}
	if diff := cmp.Diff([]types.UID{p.UID}, uids(cl.assumedPods(key, nil, t0))); diff != "" {
		t.Errorf("assumed after the landing (-want +got):\n%s", diff)
	}
	if _, leader, _ := cl.join(key, nil); !leader {
		t.Error("a join after the landing does not lead a new flight")
	}
}

// TestClaimsReserve: candidates leave out what this replica took or is
// taking (assumed, reserved, recording), what it holds (until the hold
// ends) and what the caller skips.
func TestClaimsReserve(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	pool := []*corev1.Pod{testPod("p1", readyAt(t0.Add(-3*time.Second))), testPod("p2", readyAt(t0.Add(-2*time.Second))), testPod("p3", readyAt(t0.Add(-time.Second)))}
	for _, tt := range []struct {
		name  string
		setup func(cl *claims)
		skip  map[string]bool
		at    time.Time
		want  []types.UID // reserved one after another until none is left
	}{
		{name: "longest ready first", at: t0, want: []types.UID{"uid-p1", "uid-p2", "uid-p3"}},
		{name: "skipped", skip: map[string]bool{"uid-p1": true}, at: t0, want: []types.UID{"uid-p2", "uid-p3"}},
		{name: "assumed", setup: func(cl *claims) {
			cl.land(fn.Key(), cl.start(fn.Key(), flightScale), claimedCopy(pool[0], fn, claimInfo{At: t0}), t0)
		}, at: t0, want: []types.UID{"uid-p2", "uid-p3"}},
		{name: "recording", setup: func(cl *claims) { cl.startRecording("uid-p2") }, at: t0, want: []types.UID{"uid-p1", "uid-p3"}},
		{name: "held", setup: func(cl *claims) { cl.hold("uid-p3", t0.Add(time.Minute)) }, at: t0, want: []types.UID{"uid-p1", "uid-p2"}},
		{name: "hold ended", setup: func(cl *claims) { cl.hold("uid-p3", t0.Add(time.Minute)) }, at: t0.Add(2 * time.Minute), want: []types.UID{"uid-p1", "uid-p2", "uid-p3"}},
		{name: "hold never shortened", setup: func(cl *claims) {
			cl.hold("uid-p3", t0.Add(time.Hour))
			cl.hold("uid-p3", t0.Add(time.Minute))
		}, at: t0.Add(2 * time.Minute), want: []types.UID{"uid-p1", "uid-p2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cl := newClaims(nil, nil)
			if tt.setup != nil {
				tt.setup(cl)
			}
			var got []types.UID
			for range len(pool) + 1 {
				if p := cl.reserve(fn, pool, "", tt.skip, tt.at); p != nil {
					got = append(got, p.UID)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("reserved (-want +got):\n%s", diff)
			}
			for _, uid := range got {
				cl.unreserve(uid)
			}
			if p := cl.reserve(fn, pool, "", tt.skip, tt.at); len(got) > 0 && (p == nil || p.UID != got[0]) {
				t.Errorf("after unreserve, reserved %v, want %s again", p, got[0])
			}
		})
	}
}

// TestClaimsStartScale: a scale-up counts what is expected (cached
// instances, assumed, in flight; not retired, reserved or terminating;
// assumed ones the cache also shows, once) and starts no more than is
// missing, the pool's candidates and --max-parallel-claims allow.
func TestClaimsStartScale(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	key := fn.Key()
	inst := func(name string, opts ...podOpt) *corev1.Pod {
		return testPod(name, append([]podOpt{claimedBy(fn)}, opts...)...)
	}
	pool := func(n int) []*corev1.Pod {
		var out []*corev1.Pod
		for i := range n {
			out = append(out, testPod("pool-"+string(rune('a'+i))))
		}
		return out
	}
	for _, tt := range []struct {
		name        string
		setup       func(cl *claims)
		pods, pool  []*corev1.Pod
		want, max   int
		wantStarted int
	}{
		{name: "from zero", pool: pool(5), want: 3, max: 10, wantStarted: 3},
		{name: "bounded by candidates", pool: pool(2), want: 3, max: 10, wantStarted: 2},
		{name: "empty pool: one claim waits for a pod", want: 3, max: 10, wantStarted: 1},
		{name: "empty pool, one in flight: none more", setup: func(cl *claims) { cl.start(key, flightCold) }, want: 3, max: 10, wantStarted: 0},
		{name: "bounded by max parallel", pool: pool(5), want: 5, max: 2, wantStarted: 2},
		{name: "bounded by max parallel across functions", setup: func(cl *claims) { cl.start("default/other", flightScale) }, pool: pool(5), want: 5, max: 2, wantStarted: 1},
		{name: "cached instances count", pods: []*corev1.Pod{inst("a"), inst("b")}, pool: pool(5), want: 3, max: 10, wantStarted: 1},
		{name: "terminating ones do not", pods: []*corev1.Pod{inst("a", terminating)}, pool: pool(5), want: 1, max: 10, wantStarted: 1},
		{name: "restarted ones do not", pods: []*corev1.Pod{inst("a", annotated(annClaimRestarts, "0"))}, pool: pool(5), want: 1, max: 10, wantStarted: 1},
		{name: "retired ones do not", setup: func(cl *claims) { cl.retire("uid-a", t0.Add(time.Minute)) }, pods: []*corev1.Pod{inst("a")}, pool: pool(5), want: 1, max: 10, wantStarted: 1},
		{name: "in flight ones do", setup: func(cl *claims) { cl.start(key, flightScale) }, pool: pool(5), want: 2, max: 10, wantStarted: 1},
		{name: "a reserved one counts as its flight", setup: func(cl *claims) {
			cl.start(key, flightScale)
			cl.reserved["uid-a"] = true
		}, pods: []*corev1.Pod{inst("a")}, pool: pool(5), want: 2, max: 10, wantStarted: 1},
		{name: "assumed, also cached assign-pending, counts once", setup: func(cl *claims) {
			cl.land(key, cl.start(key, flightScale), inst("a"), t0)
		}, pods: []*corev1.Pod{inst("a", annotated(annAssignPending, "x"))}, pool: pool(5), want: 2, max: 10, wantStarted: 1},
		{name: "an assumed one retired does not", setup: func(cl *claims) {
			cl.land(key, cl.start(key, flightScale), inst("a"), t0)
			cl.retire("uid-a", t0.Add(time.Minute))
		}, pool: pool(5), want: 1, max: 10, wantStarted: 1},
		{name: "an assumed one its record found another's does not", setup: func(cl *claims) {
			cl.land(key, cl.start(key, flightScale), inst("a"), t0)
			cl.recordEnded(key, "uid-a", recordForeign, t0)
		}, pool: pool(5), want: 1, max: 10, wantStarted: 1},
		{name: "enough", pods: []*corev1.Pod{inst("a"), inst("b")}, pool: pool(5), want: 2, max: 10, wantStarted: 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cl := newClaims(nil, nil)
			if tt.setup != nil {
				tt.setup(cl)
			}
			before := cl.flying(key)
			fs := cl.startScale(fn, tt.pods, tt.pool, tt.want, tt.max, t0)
			if len(fs) != tt.wantStarted {
				t.Errorf("started %d, want %d", len(fs), tt.wantStarted)
			}
			if got := cl.flying(key); got != before+len(fs) {
				t.Errorf("%d flights, want %d", got, before+len(fs))
			}
			for _, f := range fs {
				if f.kind != flightScale {
					t.Errorf("flight kind %v, want flightScale", f.kind)
				}
			}
		})
	}
}

// TestClaimsView: what a supervisor's plan reads of one function.
func TestClaimsView(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	key := fn.Key()
	a, b, c := testPod("a", claimedBy(fn)), testPod("b", claimedBy(fn)), claimedCopy(testPod("c"), fn, claimInfo{At: t0})
	cl := newClaims(nil, nil)
	cl.start(key, flightScale)
	cl.start("default/other", flightScale)
	cl.reserved[a.UID] = true
	cl.retire(b.UID, t0.Add(time.Minute))
	cl.land(key, cl.start(key, flightScale), c, t0)
	cl.retire(c.UID, t0.Add(time.Minute))
	cl.retire("uid-elsewhere", t0.Add(time.Minute))
	want := claimView{Assumed: []*corev1.Pod{c}, Reserved: []types.UID{a.UID}, Retired: []types.UID{b.UID, c.UID}, InFlight: 1}
	got := cl.view(key, []*corev1.Pod{a, b}, t0)
	if diff := cmp.Diff(want, got, cmp.Comparer(func(x, y *corev1.Pod) bool { return x.UID == y.UID })); diff != "" {
		t.Errorf("view (-want +got):\n%s", diff)
	}
	// Past the retirements: nothing retired.
	if got := cl.view(key, []*corev1.Pod{a, b}, t0.Add(2*time.Minute)); len(got.Retired) != 0 {
		t.Errorf("retired past their time: %v", got.Retired)
	}
}

// TestClaimsUnrecordedIn: a pool's pods this replica knows hold a
// function, or may, while the informer does not show them recorded.
func TestClaimsUnrecordedIn(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	key := fn.Key()
	p1, p2, p3, p4 := testPod("p1"), testPod("p2"), testPod("p3"), testPod("p4", pooled("other"))
	cl := newClaims(nil, nil)
	cl.land(key, cl.start(key, flightScale), claimedCopy(p1, fn, claimInfo{At: t0}), t0)
	cl.land(key, cl.start(key, flightScale), claimedCopy(p4, fn, claimInfo{At: t0}), t0)
	cl.reserved[p2.UID] = true
	cl.startRecording(p1.UID) // counted once
	cl.hold(p3.UID, t0.Add(time.Minute))
	if diff := cmp.Diff([]string{key}, cl.assumedKeys("default")); diff != "" {
		t.Errorf("assumed keys (-want +got):\n%s", diff)
	}
	if keys := cl.assumedKeys("elsewhere"); len(keys) != 0 {
		t.Errorf("assumed keys of another namespace: %v", keys)
	}
	if n := cl.unrecordedIn("echo", []*corev1.Pod{p1, p2, p3}, map[string][]*corev1.Pod{key: nil}, t0); n != 3 {
		t.Errorf("unrecorded %d, want 3 (p1 assumed and recording, p2 reserved, p3 held; p4 in another pool)", n)
	}
}

// TestClaimsRetire: a retirement is never shortened and forgotten once
// its time has passed.
func TestClaimsRetire(t *testing.T) {
	t.Parallel()
	cl := newClaims(nil, nil)
	cl.retire("a", t0.Add(time.Hour))
	cl.retire("a", t0.Add(time.Minute))
	cl.retire("b", t0.Add(time.Minute))
	if diff := cmp.Diff([]string{"a", "b"}, slices.Sorted(slices.Values(cl.retiredUIDs(t0)))); diff != "" {
		t.Errorf("retired at t0 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a"}, cl.retiredUIDs(t0.Add(2*time.Minute))); diff != "" {
		t.Errorf("retired past b's time (-want +got):\n%s", diff)
	}
	if _, ok := cl.retired["b"]; ok {
		t.Error("b's retirement not forgotten")
	}
}
