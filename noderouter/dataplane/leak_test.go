package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/route"
)

// fakeResolver is the control plane as the proxy sees it: resolve stores
// upd in the cache; oneshot hands out addr under a fresh pod UID per call;
// release counts the calls per pod UID.
type fakeResolver struct {
	cache *route.Cache
	upd   route.Update
	addr  string

	mu       sync.Mutex
	resolved int // Resolve calls
	handed   int
	released map[string]int
}

var _ Resolver = (*fakeResolver)(nil)

func (f *fakeResolver) Resolve(_ context.Context, ref route.Ref, _ uint64, _ []string, _ Caller) (*route.Entry, *route.Assignment, error) {
	f.mu.Lock()
	f.resolved++
	f.mu.Unlock()
	e, a, _ := f.cache.Store(ref, f.upd)
	return e, a, nil
}

func (f *fakeResolver) Oneshot(context.Context, route.Ref, Caller) (*route.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	uid := fmt.Sprintf("once-%d", f.handed)
	f.handed++
	return &route.Instance{InstanceInfo: route.InstanceInfo{Pod: "pod-" + uid, PodUID: uid, Address: f.addr}}, nil
}

func (f *fakeResolver) Release(_ route.Ref, uid string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.released == nil {
		f.released = map[string]int{}
	}
	f.released[uid]++
}

func (f *fakeResolver) releases() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.released {
		out[k] = v
	}
	return out
}

// breakingInstance answers "ok", or with ?sleep=<d> first waits d (or
// until the router gives up), or with ?break= sends its header and "part"
// and then: instance, closes its connection; hold, waits until the router
// gives up on the exchange.
func breakingInstance(t *testing.T) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if d, err := time.ParseDuration(q.Get("sleep")); err == nil {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		mode := q.Get("break")
		if mode == "" {
			_, _ = io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "part")
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		switch mode {
		case "instance":
			if conn, _, err := rc.Hijack(); err == nil {
				conn.Close()
			}
		case "hold":
			<-r.Context().Done()
		}
	}))
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String()
}

// proxyServer serves a proxy over res on loopback with the forwarder under
// test (a real server: the ReverseProxy aborts broken exchanges only
// there).
func proxyServer(t *testing.T, res *fakeResolver, mutate func(*Options)) (*Proxy, string) {
	t.Helper()
	p := testProxy(t, res, mutate)
	return p, serveProxy(t, p)
}

// testProxy is a proxy over res with the default configuration, changed
// by mutate (nil: none).
func testProxy(t *testing.T, res *fakeResolver, mutate func(*Options)) *Proxy {
	t.Helper()
	cfg := DefaultOptions()
	if mutate != nil {
		mutate(&cfg)
	}
	if err := errors.Join(cfg.Validate()...); err != nil {
		t.Fatal(err)
	}
	return New(cfg, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()), res.cache, nil, res)
}

func get(ctx context.Context, url, fn string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(HeaderFunction, fn)
	return http.DefaultClient.Do(req)
}

// TestProxyReleasesOnEveryPath: however an exchange ends — broken after
// the response's header (the caller gone, the instance gone, the request
// timeout), or before it — the instance's slot is free again (a function
// at concurrencyLimit 1 with no queue serves the next request at once),
// a oneshot instance is released exactly once, and the router's in-flight
// count is back to zero.
func TestProxyReleasesOnEveryPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		path     string
		timeout  time.Duration // the function's
		midBody  bool          // the header arrives
		cancel   bool          // the caller goes away
		wantCode string        // requests_total's code
	}{
		{name: "caller gone mid-body", path: "/?break=hold", midBody: true, cancel: true, wantCode: "499"},
		{name: "instance breaks mid-body", path: "/?break=instance", midBody: true, wantCode: "502"},
		{name: "request timeout mid-body", path: "/?break=hold", timeout: 200 * time.Millisecond, midBody: true, wantCode: "504"},
		{name: "caller gone before the header", path: "/?sleep=10s", cancel: true, wantCode: "499"},
		{name: "request timeout before the header", path: "/?sleep=10s", timeout: 200 * time.Millisecond, wantCode: "504"},
	}
	for _, oneshot := range []bool{false, true} {
		for _, tt := range tests {
			kind := "concurrencyLimit 1"
			if oneshot {
				kind = "oneshot"
			}
			t.Run(kind+"/"+tt.name, func(t *testing.T) {
				addr := breakingInstance(t)
				res := &fakeResolver{cache: &route.Cache{}, addr: addr,
					upd: route.Update{Generation: 1, Config: route.Config{ConcurrencyLimit: 1, Oneshot: oneshot, Timeout: tt.timeout}}}
				if !oneshot {
					res.upd.Instances = []route.InstanceInfo{{Pod: "pod-1", PodUID: "uid-1", Address: addr}}
				}
				p, url := proxyServer(t, res, func(c *Options) { c.MaxQueue, c.MaxInFlight = 0, 100 })
				ref := route.Ref{Namespace: "default", Name: "fn"}

				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				done := make(chan error, 1)
				go func() {
					resp, err := get(ctx, url+tt.path, "default/fn")
					if err != nil {
						done <- err
						return
					}
					defer resp.Body.Close()
					if tt.midBody {
						b := make([]byte, 4)
						if _, err := io.ReadFull(resp.Body, b); err != nil || string(b) != "part" {
							done <- fmt.Errorf("read %q: %v", b, err)
							return
						}
						if tt.cancel {
							cancel()
						}
						if _, err := io.ReadAll(resp.Body); err == nil {
							done <- fmt.Errorf("the broken body ended cleanly")
							return
						}
					} else if _, err := io.ReadAll(resp.Body); err != nil {
						done <- err
						return
					}
					done <- nil
				}()
				if tt.cancel && !tt.midBody {
					poll.Until(t, pollTimeout, pollInterval, "the request at the instance", func(context.Context) error {
						e, _ := res.cache.Lookup(ref)
						if e == nil {
							return errors.New("no cache entry")
						}
						return poll.Unmet(e.InFlight.Load() == 1, "%d in flight", e.InFlight.Load())
					})
					cancel()
				}
				if err := <-done; err != nil && !tt.cancel {
					t.Fatal(err)
				}

				m := p.m
				poll.Until(t, pollTimeout, pollInterval, "the request counted", func(context.Context) error {
					got := routertest.Counter(m.requests.WithLabelValues("default/fn", tt.wantCode))
					return poll.Unmet(got == 1, "requests_total{%s} = %v", tt.wantCode, got)
				})
				poll.Until(t, pollTimeout, pollInterval, "the router's in-flight back to 0", func(context.Context) error {
					return poll.Unmet(p.inFlight.Load() == 0, "router in-flight %d", p.inFlight.Load())
				})
				e, a := res.cache.Lookup(ref)
				if got := e.InFlight.Load(); got != 0 {
					t.Errorf("function in-flight = %d, want 0", got)
				}
				if !oneshot {
					if got := a.Instances[0].InFlight.Load(); got != 0 {
						t.Errorf("instance in-flight = %d, want 0: the slot leaked", got)
					}
				}

				// The next request is served at once.
				start := time.Now()
				resp, err := get(t.Context(), url, "default/fn")
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(b) != "ok" {
					t.Errorf("next request: %d %s", resp.StatusCode, b)
				}
				if d := time.Since(start); d > 2*time.Second {
					t.Errorf("next request took %v", d)
				}
				if oneshot {
					want := map[string]int{"once-0": 1, "once-1": 1}
					poll.Until(t, pollTimeout, pollInterval, "both oneshot instances released", func(context.Context) error {
						return poll.Unmet(len(res.releases()) == 2, "releases %v", res.releases())
					})
					if diff := cmp.Diff(want, res.releases()); diff != "" {
						t.Errorf("releases by pod UID (-want +got):\n%s", diff)
					}
				}
			})
		}
	}
}

// TestProxyQueueReleases: a request that leaves the queue without an
// instance (its caller gone, the queue timeout) holds no slot afterwards.
func TestProxyQueueReleases(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		cancel bool
	}{
		{name: "caller gone while queued", cancel: true},
		{name: "queue timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := breakingInstance(t)
			res := &fakeResolver{cache: &route.Cache{}, addr: addr, upd: route.Update{Generation: 1,
				Instances: []route.InstanceInfo{{Pod: "pod-1", PodUID: "uid-1", Address: addr}}, Config: route.Config{ConcurrencyLimit: 1}}}
			p, url := proxyServer(t, res, func(c *Options) { c.MaxQueue, c.ColdStartTimeout = 1, 150*time.Millisecond })
			ref := route.Ref{Namespace: "default", Name: "fn"}

			busy := make(chan int, 1)
			go func() {
				resp, err := get(t.Context(), url+"/?sleep=400ms", "default/fn")
				if err != nil {
					busy <- -1
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				busy <- resp.StatusCode
			}()
			poll.Until(t, pollTimeout, pollInterval, "the first request in flight", func(context.Context) error {
				e, _ := res.cache.Lookup(ref)
				if e == nil {
					return errors.New("no cache entry")
				}
				return poll.Unmet(e.InFlight.Load() == 1, "%d in flight", e.InFlight.Load())
			})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			queued := make(chan int, 1)
			go func() {
				resp, err := get(ctx, url, "default/fn")
				if err != nil {
					queued <- -1
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				queued <- resp.StatusCode
			}()
			e, a := res.cache.Lookup(ref)
			if tt.cancel {
				poll.Until(t, pollTimeout, pollInterval, "the second request queued", func(context.Context) error { return poll.Unmet(e.Queued() == 1, "%d queued", e.Queued()) })
				cancel()
			}
			want := http.StatusServiceUnavailable
			if tt.cancel {
				want = -1
			}
			if got := <-queued; got != want {
				t.Errorf("queued request: %d, want %d", got, want)
			}
			if got := <-busy; got != 200 {
				t.Errorf("busy request: %d", got)
			}
			poll.Until(t, pollTimeout, pollInterval, "the slot free", func(context.Context) error {
				in, all := a.Instances[0].InFlight.Load(), p.inFlight.Load()
				return poll.Unmet(in == 0 && all == 0, "instance in-flight %d, router in-flight %d", in, all)
			})
			if e.Queued() != 0 {
				t.Errorf("queued = %d, want 0", e.Queued())
			}
			resp, err := get(t.Context(), url, "default/fn")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("next request: %d", resp.StatusCode)
			}
		})
	}
}

// TestMaxInFlight: one request over --max-in-flight gets 503 with
// Retry-After and reason router_overloaded, counted on the function only
// when the router's cache knows it.
func TestMaxInFlight(t *testing.T) {
	t.Parallel()
	addr := breakingInstance(t)
	res := &fakeResolver{cache: &route.Cache{}, addr: addr, upd: route.Update{Generation: 1,
		Instances: []route.InstanceInfo{{Pod: "pod-1", PodUID: "uid-1", Address: addr}}}}
	p, url := proxyServer(t, res, func(c *Options) { c.MaxInFlight = 1 })

	busy := make(chan int, 1)
	go func() {
		resp, err := get(t.Context(), url+"/?sleep=300ms", "default/fn")
		if err != nil {
			busy <- -1
			return
		}
		resp.Body.Close()
		busy <- resp.StatusCode
	}()
	poll.Until(t, pollTimeout, pollInterval, "the first request in flight", func(context.Context) error {
		return poll.Unmet(p.inFlight.Load() == 1, "router in-flight %d", p.inFlight.Load())
	})
	for _, fn := range []string{"default/fn", "default/made-up"} {
		resp, err := get(t.Context(), url, fn)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body errorBody
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatalf("body %q: %v", b, err)
		}
		want := errorBody{Error: "the router is at its limit of 1 requests in flight", Reason: ReasonRouterOverloaded, Function: fn}
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != retryAfter || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d, Retry-After %q, Content-Type %q; want 503 JSON with Retry-After", fn, resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Content-Type"))
		}
		if diff := cmp.Diff(want, body); diff != "" {
			t.Errorf("%s: body (-want +got):\n%s", fn, diff)
		}
	}
	if got := <-busy; got != 200 {
		t.Errorf("busy request: %d", got)
	}
	m := p.m
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"rejected_total{router_overloaded}", routertest.Counter(m.rejected.WithLabelValues(ReasonRouterOverloaded)), 2},
		{"rejected_total{body_too_large}", routertest.Counter(m.rejected.WithLabelValues(ReasonBodyTooLarge)), 0},
		{"requests_total{default/fn,503}", routertest.Counter(m.requests.WithLabelValues("default/fn", "503")), 1},
		{"requests_total{\"\",503} (a name the cache does not know)", routertest.Counter(m.requests.WithLabelValues("", "503")), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if n := p.inFlight.Load(); n != 0 {
		t.Errorf("router in-flight = %d after every request ended", n)
	}
	resp, err := get(t.Context(), url, "default/fn")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("after the load: %d", resp.StatusCode)
	}
}

// TestDefaultBodyLimit: without --max-body-bytes a body over 10 MiB gets
// 413 with a JSON reason before any instance is asked; the function's own
// limit may replace it, so the first call of a function the router has
// not seen goes to the control plane for its config, and later ones are
// refused before it.
func TestDefaultBodyLimit(t *testing.T) {
	t.Parallel()
	if got := DefaultOptions().MaxBodyBytes; got != 10<<20 {
		t.Fatalf("default --max-body-bytes = %d, want 10 MiB", got)
	}
	res := &fakeResolver{cache: &route.Cache{}}
	cfg := DefaultOptions()
	p := New(cfg, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()), res.cache, nil, res)
	for i := range 2 {
		req := httptest.NewRequest("POST", "http://198.51.100.11:8380/", strings.NewReader("x"))
		req.ContentLength = 10<<20 + 1 // announced: answered before a byte is read
		req.Header.Set(HeaderFunction, "default/fn")
		w := httptest.NewRecorder()
		p.nethttp.ServeHTTP(w, req)
		var body errorBody
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if w.Code != http.StatusRequestEntityTooLarge || body.Reason != ReasonBodyTooLarge || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("call %d: %d %s %q, want 413 JSON %s", i, w.Code, w.Header().Get("Content-Type"), w.Body, ReasonBodyTooLarge)
		}
	}
	if got := routertest.Counter(p.m.rejected.WithLabelValues(ReasonBodyTooLarge)); got != 2 {
		t.Errorf("rejected_total{body_too_large} = %v, want 2", got)
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	if res.resolved != 1 {
		t.Errorf("%d calls to the control plane, want 1 (the first, for the function's limit)", res.resolved)
	}
}
