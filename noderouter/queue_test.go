package noderouter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

// limited answers GetInstance with one instance and a concurrency limit.
func limited(limit uint32, ins ...*pb.Instance) func(context.Context, *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
	return func(_ context.Context, req *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		return &pb.GetInstanceResponse{Function: req.GetFunction(), Generation: 1, Instances: ins,
			Config: &pb.FunctionConfig{ConcurrencyLimit: limit}}, nil
	}
}

// goCall sends a request in the background; its answer arrives on the
// returned channel.
func (h *harness) goCall(t *testing.T, fn, path string) <-chan reply {
	t.Helper()
	ch := make(chan reply, 1)
	go func() {
		code, b, err := h.send(t.Context(), "GET", fn, path, "")
		if err != nil {
			code, b = -1, []byte(err.Error())
		}
		ch <- reply{status: code, body: b}
	}()
	return ch
}

func reasonIn(t *testing.T, r reply) string {
	t.Helper()
	return reasonOf(t, r.body)
}

func TestConcurrencyLimitQueues(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", limited(1, inst("uid-1", startEcho(t, "uid-1"))))
	h := startRouter(t, fake, func(c *Config) { c.MaxQueue = 1 })
	ref := route.Ref{Namespace: "default", Name: "echo"}

	first := h.goCall(t, "default/echo", "/?sleep=300ms")
	poll.Until(t, pollTimeout, pollInterval, "the first request in flight", func(context.Context) error {
		e, _ := h.rt.cache.Lookup(ref)
		if e == nil {
			return errors.New("no cache entry")
		}
		return poll.Unmet(e.InFlight.Load() == 1, "%d in flight", e.InFlight.Load())
	})
	second := h.goCall(t, "default/echo", "/")
	poll.Until(t, pollTimeout, pollInterval, "the second request queued", func(context.Context) error {
		e, _ := h.rt.cache.Lookup(ref)
		return poll.Unmet(e.Queued() == 1, "%d queued", e.Queued())
	})
	poll.Until(t, pollTimeout, pollInterval, "a report with one queued request", fake.holds(func(f *fakeController) error {
		n := len(f.reports)
		if n == 0 || len(f.reports[n-1].GetFunctions()) == 0 {
			return fmt.Errorf("%d reports, the last of no function", n)
		}
		fr := f.reports[n-1].GetFunctions()[0]
		return poll.Unmet(fr.GetQueued() == 1 && fr.GetInFlight() == 1, "the last report: %d queued, %d in flight", fr.GetQueued(), fr.GetInFlight())
	}))

	// The queue holds one: the third is turned away at once.
	r := h.call(t, "default/echo")
	if r.status != 503 || r.header.Get("Retry-After") == "" || reasonIn(t, r) != dataplane.ReasonQueueFull {
		t.Errorf("third request: %d, Retry-After %q, body %s; want 503 queue_full with Retry-After", r.status, r.header.Get("Retry-After"), r.body)
	}
	for name, ch := range map[string]<-chan reply{"first": first, "second": second} {
		if r := <-ch; r.status != 200 {
			t.Errorf("%s request: %d %s", name, r.status, r.body)
		}
	}
	if got := len(fake.getCalls()); got != 1 {
		t.Errorf("GetInstance calls = %d, want 1 (a full function queues; the controller scales from the reports)", got)
	}
	e, a := h.rt.cache.Lookup(ref)
	if e.Queued() != 0 || a.Instances[0].InFlight.Load() != 0 || e.InFlight.Load() != 0 {
		t.Errorf("afterwards queued %d, in-flight %d/%d; want 0", e.Queued(), a.Instances[0].InFlight.Load(), e.InFlight.Load())
	}
}

func TestConcurrencyLimitQueueTimeout(t *testing.T) {
	// Not parallel: it bounds how long the queued request waits (900ms).
	fake := startFakeController(t)
	fake.handle("default/echo", limited(1, inst("uid-1", startEcho(t, "uid-1"))))
	fake.handle("default/strict", limited(1, inst("uid-2", startEcho(t, "uid-2"))))
	h := startRouter(t, fake, func(c *Config) { c.ColdStartTimeout = 100 * time.Millisecond })

	busy := h.goCall(t, "default/echo", "/?sleep=1s")
	poll.Until(t, pollTimeout, pollInterval, "the first request in flight", func(context.Context) error {
		e, _ := h.rt.cache.Lookup(route.Ref{Namespace: "default", Name: "echo"})
		if e == nil {
			return errors.New("no cache entry")
		}
		return poll.Unmet(e.InFlight.Load() == 1, "%d in flight", e.InFlight.Load())
	})
	start := time.Now()
	r := h.call(t, "default/echo")
	if r.status != 503 || r.header.Get("Retry-After") == "" || reasonIn(t, r) != dataplane.ReasonQueueTimeout {
		t.Errorf("queued request: %d, body %s; want 503 queue_timeout with Retry-After", r.status, r.body)
	}
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Errorf("the queued request waited %s: longer than the cold-start timeout", d)
	}
	if r := <-busy; r.status != 200 {
		t.Errorf("busy request: %d", r.status)
	}

	// --max-queue 0: no queue at all.
	h = startRouter(t, fake, func(c *Config) { c.MaxQueue = 0 })
	busy = h.goCall(t, "default/strict", "/?sleep=300ms")
	poll.Until(t, pollTimeout, pollInterval, "the first request in flight", func(context.Context) error {
		e, _ := h.rt.cache.Lookup(route.Ref{Namespace: "default", Name: "strict"})
		if e == nil {
			return errors.New("no cache entry")
		}
		return poll.Unmet(e.InFlight.Load() == 1, "%d in flight", e.InFlight.Load())
	})
	if r := h.call(t, "default/strict"); r.status != 503 || reasonIn(t, r) != dataplane.ReasonQueueFull {
		t.Errorf("with no queue: %d %s; want 503 queue_full", r.status, r.body)
	}
	<-busy
}

// TestOneReportPerIntervalAtScale: with 1,000 active functions the router
// still sends one report per interval to their controller, each covering
// every function.
func TestOneReportPerIntervalAtScale(t *testing.T) {
	t.Parallel()
	const functions = 1000
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	h := startRouter(t, fake, func(c *Config) { c.ReportInterval = 50 * time.Millisecond })
	for i := range functions {
		h.rt.cache.Store(route.Ref{Namespace: "load", Name: fmt.Sprintf("fn-%d", i)}, route.Update{Generation: 1,
			Instances: []route.InstanceInfo{{Pod: "p", PodUID: fmt.Sprintf("u-%d", i), Address: "198.18.0.10:8080"}}})
	}
	// The stream opens with the first GetInstance.
	if r := h.call(t, "default/echo"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	var first int
	poll.Until(t, pollTimeout, pollInterval, "a report covering every function", fake.holds(func(f *fakeController) error {
		for i, r := range f.reports {
			if len(r.GetFunctions()) == functions+1 {
				first = i
				return nil
			}
		}
		return fmt.Errorf("%d reports, none of %d functions", len(f.reports), functions+1)
	}))
	start := time.Now()
	poll.Until(t, pollTimeout, pollInterval, "ten more reports", fake.holds(func(f *fakeController) error {
		return poll.Unmet(len(f.reports) >= first+11, "%d reports", len(f.reports))
	}))
	elapsed := time.Since(start)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	n := len(fake.reports) - first - 1
	if max := int(elapsed/(50*time.Millisecond)) + 2; n > max {
		t.Errorf("%d reports in %s at a 50ms interval: more than one per interval", n, elapsed)
	}
	for i, r := range fake.reports[first:] {
		if len(r.GetFunctions()) != functions+1 {
			t.Errorf("report %d covers %d functions, want %d", i, len(r.GetFunctions()), functions+1)
		}
		if i > 0 && r.GetSequence() != fake.reports[first+i-1].GetSequence()+1 {
			t.Errorf("report %d: sequence %d after %d", i, r.GetSequence(), fake.reports[first+i-1].GetSequence())
		}
	}
}
