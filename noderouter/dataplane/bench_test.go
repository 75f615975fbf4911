package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"skipper.dev/skipper/noderouter/callers"
	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/route"
)

// noResolver fails the benchmark if a warm request asks the control plane.
type noResolver struct{ b *testing.B }

func (n noResolver) Resolve(context.Context, route.Ref, uint64, []string, Caller) (*route.Entry, *route.Assignment, error) {
	n.b.Fatal("warm request called GetInstance")
	return nil, nil, nil
}

func (n noResolver) Oneshot(context.Context, route.Ref, Caller) (*route.Instance, error) {
	n.b.Fatal("oneshot in a benchmark")
	return nil, nil
}

func (n noResolver) Release(route.Ref, string) {}

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
	p := warmProxy(b, benchBackend(b))
	b.Cleanup(p.nethttp.transport.CloseIdleConnections)
	req := httptest.NewRequest("GET", "http://198.51.100.11:8380/hello", nil)
	req.Header.Set(HeaderFunction, "default/echo")
	w := &discard{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		p.nethttp.ServeHTTP(w, req)
	}
}

// warmProxy is a proxy whose cache holds default/echo at addr.
func warmProxy(b *testing.B, addr string) *Proxy {
	cfg := DefaultOptions()
	cache := &route.Cache{}
	cache.Store(route.Ref{Namespace: "default", Name: "echo"}, route.Update{Generation: 1,
		Instances: []route.InstanceInfo{{Pod: "p", PodUID: "u", Address: addr}}})
	return New(cfg, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()), cache, nil, noResolver{b})
}

// BenchmarkDirect is BenchmarkProxyWarm's exchange without the router.
func BenchmarkDirect(b *testing.B) {
	addr := benchBackend(b)
	tr := newTransport(DefaultOptions())
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
	cfg := DefaultOptions()
	cache := &route.Cache{}
	cache.Store(route.Ref{Namespace: "default", Name: "echo"}, route.Update{Generation: 1,
		Instances: []route.InstanceInfo{{Pod: "p1", PodUID: "u1", Address: "198.18.0.10:8080"}, {Pod: "p2", PodUID: "u2", Address: "198.18.0.11:8080"}},
		Config:    route.Config{ConcurrencyLimit: 100}})
	p := New(cfg, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()), cache, nil, noResolver{b})
	p.nethttp.rp.Transport = cannedTransport{}
	req := httptest.NewRequest("GET", "http://198.51.100.11:8380/hello", nil)
	req.Header.Set(HeaderFunction, "default/echo")
	w := &discard{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		p.nethttp.ServeHTTP(w, req)
	}
}

// rawBackend is an instance that answers every request head it reads with
// a fixed 200, allocating nothing per request: in a benchmark over it, the
// allocations are the router's.
func rawBackend(b *testing.B) string {
	b.Helper()
	ln := routertest.Listen(b)
	b.Cleanup(func() { ln.Close() })
	const answer = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n"
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					// Heads without bodies: read to the blank line.
					for {
						line, err := br.ReadSlice('\n')
						if err != nil {
							return
						}
						if len(line) <= 2 {
							break
						}
					}
					if _, err := io.WriteString(c, answer); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// BenchmarkProxyWarmServed is a warm request through the router's served
// path (server, core, forwarder) from a raw keep-alive client to a raw
// instance on loopback, per forwarder: allocs/op are the router's own
// (issue 14: at most 5). The callers variants call a function that lists
// its callers (spec.callers, issue 16: allocations unchanged), the caller
// found in a caller index of 10,000 pods.
func BenchmarkProxyWarmServed(b *testing.B) {
	for _, name := range []string{ForwarderLoop, ForwarderH1, ForwarderNethttp,
		ForwarderLoop + "-callers", ForwarderH1 + "-callers", ForwarderNethttp + "-callers"} {
		fwd, withCallers := strings.CutSuffix(name, "-callers")
		b.Run(name, func(b *testing.B) {
			addr := rawBackend(b)
			cfg := DefaultOptions()
			cache := &route.Cache{}
			var pol *callers.Policy
			if withCallers {
				pol = callers.NewPolicy([]string{"team-a", "team-b"}, []string{"team-c/web", "default/bench"})
			}
			cache.Store(route.Ref{Namespace: "default", Name: "echo"}, route.Update{Generation: 1,
				Instances: []route.InstanceInfo{{Pod: "p", PodUID: "u", Address: addr}}, Config: route.Config{Callers: pol}})
			p := New(cfg, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()), cache, nil, noResolver{b})
			if withCallers {
				idx := &callers.Index{}
				for i := range 10000 {
					ip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
					idx.Set(fmt.Sprintf("uid-%d", i), callers.NewIdentity("other", "default", fmt.Sprintf("p-%d", i)), []netip.Addr{ip})
				}
				idx.Set("uid-bench", callers.NewIdentity("default", "bench", "bench"), []netip.Addr{netip.MustParseAddr("127.0.0.1")})
				p.identify = idx.Lookup
			}
			url := serveProxyWith(b, p, fwd)
			c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			const req = "GET /hello HTTP/1.1\r\nHost: 198.51.100.11:8380\r\nX-Skipper-Function: default/echo\r\n\r\n"
			br := bufio.NewReader(c)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := io.WriteString(c, req); err != nil {
					b.Fatal(err)
				}
				if err := readCanned(br); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// readCanned reads one response with a Content-Length body.
func readCanned(br *bufio.Reader) error {
	n := -1
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) <= 2 {
			break
		}
		if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
			n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	if n < 0 {
		return errors.New("response without Content-Length")
	}
	_, err := br.Discard(n)
	return err
}
