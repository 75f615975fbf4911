package noderouter

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"skipper.dev/skipper/noderouter/route"
)

// noResolver fails the benchmark if a warm request asks the control plane.
type noResolver struct{ b *testing.B }

func (n noResolver) resolve(context.Context, route.Ref, uint64, []string) (*route.Entry, *route.Assignment, error) {
	n.b.Fatal("warm request called GetInstance")
	return nil, nil, nil
}

func (n noResolver) oneshot(context.Context, route.Ref) (*route.Instance, error) {
	n.b.Fatal("oneshot in a benchmark")
	return nil, nil
}

func (n noResolver) release(route.Ref, string) {}

// discard is a reusable ResponseWriter.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

func benchBackend(b *testing.B) string {
	b.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	}))
	b.Cleanup(ts.Close)
	return ts.Listener.Addr().String()
}

// BenchmarkProxyWarm measures a warm proxied request through the router's
// handler to a trivial instance on loopback: parse, cache lookup, pick,
// forward on a kept-alive connection, copy the answer. Compare with
// BenchmarkDirect (the same exchange without the router) to get the router's
// own cost; allocations include the instance's server side.
func BenchmarkProxyWarm(b *testing.B) {
	addr := benchBackend(b)
	cfg := DefaultConfig()
	cfg.NodeName, cfg.PodName = "bench", "bench"
	cache := &route.Cache{}
	cache.Store(route.Ref{Namespace: "default", Name: "echo"}, route.Update{Generation: 1,
		Instances: []route.InstanceInfo{{Pod: "p", PodUID: "u", Address: addr}}})
	p := newProxy(cfg, slog.New(slog.DiscardHandler), newMetrics("bench"), cache, nil, noResolver{b})
	b.Cleanup(p.transport.CloseIdleConnections)
	req := httptest.NewRequest("GET", "http://198.51.100.11:8380/hello", nil)
	req.Header.Set(HeaderFunction, "default/echo")
	w := &discard{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		p.ServeHTTP(w, req)
	}
}

// BenchmarkDirect is BenchmarkProxyWarm's exchange without the router.
func BenchmarkDirect(b *testing.B) {
	addr := benchBackend(b)
	tr := newTransport(DefaultConfig())
	b.Cleanup(tr.CloseIdleConnections)
	req := httptest.NewRequest("GET", "http://"+addr+"/hello", nil)
	req.RequestURI = ""
	b.ReportAllocs()
	for b.Loop() {
		resp, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// cannedTransport answers every request at once with a small 200, without
// a network: what remains is the router's own work.
type cannedTransport struct{}

func (cannedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{"Content-Type": {"text/plain"}},
		Body: http.NoBody, ContentLength: 0, Request: r}, nil
}

// BenchmarkProxyOverhead is the router's own work per warm proxied request:
// parse the name, look up the cache, pick by two choices (with a
// concurrency limit, as the slot is a CAS), rewrite the headers, run the
// ReverseProxy and record the metrics, against an in-memory instance. The
// canned response accounts for 3 of the allocations.
func BenchmarkProxyOverhead(b *testing.B) {
	cfg := DefaultConfig()
	cfg.NodeName, cfg.PodName = "bench", "bench"
	cache := &route.Cache{}
	cache.Store(route.Ref{Namespace: "default", Name: "echo"}, route.Update{Generation: 1,
		Instances: []route.InstanceInfo{{Pod: "p1", PodUID: "u1", Address: "198.18.0.10:8080"}, {Pod: "p2", PodUID: "u2", Address: "198.18.0.11:8080"}},
		Config:    route.Config{ConcurrencyLimit: 100}})
	p := newProxy(cfg, slog.New(slog.DiscardHandler), newMetrics("bench"), cache, nil, noResolver{b})
	p.rp.Transport = cannedTransport{}
	req := httptest.NewRequest("GET", "http://198.51.100.11:8380/hello", nil)
	req.Header.Set(HeaderFunction, "default/echo")
	w := &discard{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		p.ServeHTTP(w, req)
	}
}
