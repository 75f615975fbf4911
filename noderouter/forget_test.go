package noderouter

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

// seriesOf returns the names of the metrics with a series labelled
// function=fn.
func seriesOf(t *testing.T, m *metrics, fn string) []string {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "function" && l.GetValue() == fn && !slices.Contains(out, mf.GetName()) {
					out = append(out, mf.GetName())
				}
			}
		}
	}
	return out
}

// reported returns, per report the fake received, the function's
// requests_total in it, -1 where it was left out.
func (f *fakeController) reported(fn string) []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]int64, len(f.reports))
	for i, r := range f.reports {
		out[i] = -1
		for _, fr := range r.GetFunctions() {
			if fr.GetFunction().GetNamespace()+"/"+fr.GetFunction().GetName() == fn {
				out[i] = int64(fr.GetRequestsTotal())
			}
		}
	}
	return out
}

// lastReported is the function's requests_total in the last report that
// held it, and how many reports came after that one.
func lastReported(counts []int64) (last int64, after int) {
	last = -1
	for i := len(counts) - 1; i >= 0; i-- {
		if counts[i] >= 0 {
			return counts[i], len(counts) - 1 - i
		}
	}
	return last, len(counts)
}

// TestRemovedFunctionIsForgotten: an update marking the function removed
// (the controller's answer to a deleted Function) drops its cache entry and
// its series once nothing of it is in flight and a report carried its
// final counters; later reports leave it out.
func TestRemovedFunctionIsForgotten(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	h := startRouter(t, fake, nil)
	ref := route.Ref{Namespace: "default", Name: "echo"}
	for range 2 {
		if r := h.call(t, "default/echo"); r.status != 200 {
			t.Fatalf("status %d %s", r.status, r.body)
		}
	}
	slow := h.goCall(t, "default/echo", "/?sleep=1s")
	poll.Until(t, pollTimeout, pollInterval, "the slow request in flight", func(context.Context) error {
		e, _ := h.rt.cache.Lookup(ref)
		return poll.Unmet(e.InFlight.Load() == 1, "%d in flight", e.InFlight.Load())
	})
	if got := seriesOf(t, h.rt.m, "default/echo"); len(got) == 0 {
		t.Fatal("no series of the function before its removal")
	}

	fake.push <- &pb.ControllerMessage{Message: &pb.ControllerMessage_Update{Update: &pb.AssignmentUpdate{
		Function: &pb.FunctionRef{Namespace: "default", Name: "echo"}, Generation: 2, Removed: true}}}
	poll.Until(t, pollTimeout, pollInterval, "the removal acknowledged", fake.holds(func(f *fakeController) error {
		return poll.Unmet(len(f.acks) > 0 && f.acks[len(f.acks)-1].GetGeneration() == 2, "acks %v", f.acks)
	}))
	// The request in flight keeps the entry (its count is not final yet).
	if e, a := h.rt.cache.Lookup(ref); e == nil || a != nil {
		t.Errorf("with a request in flight: entry %v, assignment %v; want the entry without its assignment", e, a)
	}
	if r := <-slow; r.status != 200 {
		t.Errorf("the request in flight at the removal: %d %s", r.status, r.body)
	}
	poll.Until(t, pollTimeout, pollInterval, "the entry dropped", func(context.Context) error {
		e, _ := h.rt.cache.Lookup(ref)
		return poll.Unmet(e == nil, "entry %v", e)
	})
	poll.Until(t, pollTimeout, pollInterval, "two reports after the last that held it", func(context.Context) error {
		_, after := lastReported(fake.reported("default/echo"))
		return poll.Unmet(after >= 2, "%d reports after", after)
	})
	if last, _ := lastReported(fake.reported("default/echo")); last != 3 {
		t.Errorf("requests_total in the last report that held the function = %d, want 3 (its final count)", last)
	}
	if got := seriesOf(t, h.rt.m, "default/echo"); len(got) != 0 {
		t.Errorf("series of the removed function left: %v", got)
	}

	// It comes back: a new entry, served as any cold function.
	if r := h.call(t, "default/echo"); r.status != 200 {
		t.Errorf("after the function came back: %d %s", r.status, r.body)
	}
}

// TestNotFoundForgetsFunction: a function deleted while no update reached
// the router (its entry had no usable instance left) is forgotten after
// GetInstance answers NotFound, once a report carried its counters.
func TestNotFoundForgetsFunction(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t) // no handler: every GetInstance is NotFound
	h := startRouter(t, fake, nil)
	ref := route.Ref{Namespace: "default", Name: "gone"}
	e, _, _ := h.rt.cache.Store(ref, route.Update{Generation: 4}) // every instance evicted
	e.Requests.Add(5)
	h.rt.m.dp.Served("default/gone", 200, .01)

	if r := h.call(t, "default/gone"); r.status != 404 || reasonOf(t, r.body) != dataplane.ReasonUnknownFunction {
		t.Fatalf("status %d %s, want 404 %s", r.status, r.body, dataplane.ReasonUnknownFunction)
	}
	if calls := fake.getCalls(); len(calls) != 1 || calls[0].GetKnownGeneration() != 4 {
		t.Fatalf("GetInstance calls %v, want one naming generation 4", calls)
	}
	poll.Until(t, pollTimeout, pollInterval, "the entry dropped", func(context.Context) error {
		e, _ := h.rt.cache.Lookup(ref)
		return poll.Unmet(e == nil, "entry %v", e)
	})
	// The entry leaves once the report holding its counters is sent; the
	// fake records what it receives on its own goroutine, so wait for it.
	poll.Until(t, pollTimeout, pollInterval, "a report holding the function's final count", func(context.Context) error {
		last, _ := lastReported(fake.reported("default/gone"))
		return poll.Unmet(last >= 0, "last report %d", last)
	})
	if last, _ := lastReported(fake.reported("default/gone")); last != 5 {
		t.Errorf("requests_total in the last report that held the function = %d, want 5", last)
	}
	if got := seriesOf(t, h.rt.m, "default/gone"); len(got) != 0 {
		t.Errorf("series of the deleted function left: %v", got)
	}
	// More calls for the deleted name make no series and no entry.
	for range 3 {
		h.call(t, "default/gone")
	}
	if e, _ := h.rt.cache.Lookup(ref); e != nil {
		t.Errorf("a 404 made an entry")
	}
	if got := seriesOf(t, h.rt.m, "default/gone"); len(got) != 0 {
		t.Errorf("404s made series: %v", got)
	}
}

// TestSweepDropsIdleEntries: an entry with no instance and no request for
// --cache-idle-timeout leaves the cache with its series; one with
// instances, or with requests, stays.
func TestSweepDropsIdleEntries(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.CacheIdleTimeout = 10 * time.Minute
	m := newMetrics("node1")
	cache := &route.Cache{}
	cp := newControlPlane(cfg, slog.New(slog.DiscardHandler), m, cache, nil, &pb.RouterIdentity{})
	t.Cleanup(cp.close)
	fns := map[string]route.Update{
		"idle":   {Generation: 1},
		"busy":   {Generation: 1},
		"warm":   {Generation: 1, Instances: []route.InstanceInfo{{Pod: "p", PodUID: "u", Address: "198.18.0.10:8080"}}},
		"oneoff": {Generation: 1, Config: route.Config{Oneshot: true}},
	}
	entries := map[string]*route.Entry{}
	for name, u := range fns {
		e, _, _ := cache.Store(route.Ref{Namespace: "default", Name: name}, u)
		entries[name] = e
		m.dp.Served(e.Key, 200, .01)
	}
	t0 := time.Now()
	cp.sweep(t0)
	entries["busy"].Requests.Add(1)
	cp.sweep(t0.Add(cfg.CacheIdleTimeout / 2))
	cp.sweep(t0.Add(cfg.CacheIdleTimeout))

	var cached, withSeries []string
	for _, e := range cache.Entries() {
		cached = append(cached, e.Ref.Name)
	}
	for name := range fns {
		if len(seriesOf(t, m, "default/"+name)) > 0 {
			withSeries = append(withSeries, name)
		}
	}
	slices.Sort(cached)
	slices.Sort(withSeries)
	want := []string{"busy", "warm"}
	if diff := cmp.Diff(want, cached); diff != "" {
		t.Errorf("entries left (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, withSeries); diff != "" {
		t.Errorf("functions with series left (-want +got):\n%s", diff)
	}
}
