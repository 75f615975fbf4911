package dataplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/route"
)

// seqResolver stores its updates in turn, one per resolve (the last one
// again after that).
type seqResolver struct {
	cache *route.Cache
	mu    sync.Mutex
	upds  []route.Update
}

func (r *seqResolver) Resolve(_ context.Context, ref route.Ref, _ uint64, _ []string, _ Caller) (*route.Entry, *route.Assignment, error) {
	r.mu.Lock()
	u := r.upds[0]
	if len(r.upds) > 1 {
		r.upds = r.upds[1:]
	}
	r.mu.Unlock()
	e, a, _ := r.cache.Store(ref, u)
	return e, a, nil
}

func (r *seqResolver) Oneshot(context.Context, route.Ref, Caller) (*route.Instance, error) {
	return nil, fmt.Errorf("no oneshot here")
}

func (r *seqResolver) Release(route.Ref, string) {}

// errorCount counts the records at level Error a logger writes (a lease
// ended twice is one).
type errorCount struct{ n atomic.Int64 }

func (h *errorCount) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h *errorCount) Handle(context.Context, slog.Record) error    { h.n.Add(1); return nil }
func (h *errorCount) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *errorCount) WithGroup(string) slog.Handler                { return h }

// exitInstance serves the ways a request can end at an instance: "ok";
// /stream, a chunked answer (an event loop hands it over mid-answer);
// /sleep, no answer until the request is given up; /break, a head and
// "part", then the connection closed.
func exitInstance(t *testing.T) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		switch r.URL.Path {
		case "/stream":
			for range 3 {
				_, _ = io.WriteString(w, "chunk")
				_ = rc.Flush()
			}
		case "/sleep":
			<-r.Context().Done()
		case "/break":
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "part")
			_ = rc.Flush()
			if conn, _, err := rc.Hijack(); err == nil {
				conn.Close()
			}
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String()
}

// requestsOf sums requests_total over every code for function fn.
func requestsOf(t *testing.T, m *Metrics, fn string) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() { m.requests.Collect(ch); close(ch) }()
	sum := 0.0
	for mt := range ch {
		var d dto.Metric
		if err := mt.Write(&d); err != nil {
			t.Fatal(err)
		}
		for _, lp := range d.GetLabel() {
			if lp.GetName() == "function" && lp.GetValue() == fn {
				sum += d.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestLeaseEveryExit drives a request out of the pipeline by every exit
// through the forwarder under test (make unit runs each): served, refused,
// retried elsewhere, an instance error before and after the answer's
// head, the caller gone, the timeout, handed over by an event loop
// mid-answer, upgraded. After each, the instance's slot, the function's
// and the router's in-flight counts are back at zero, the request counted
// exactly once under the code it ended with, and no lease ended twice.
func TestLeaseEveryExit(t *testing.T) {
	t.Parallel()
	good := exitInstance(t)
	tests := []struct {
		name     string
		upds     []route.Update // the owner's answers, in turn
		method   string
		path     string
		body     string
		upgrade  bool
		cancel   time.Duration // the caller gives up after this
		wantCode string
		retries  float64
		// handover: how an event loop hands the request on ("": it does
		// not, or the request is not one it takes).
		handover string
		// warmDead: the cached set is a dead instance, found warm (the
		// owner's next answer is the healthy one).
		warmDead bool
		// maxAttempts: --max-attempts (0: the default).
		maxAttempts int
		// deadAt: warmDead's address ("": a closed port); one that is no
		// address fails its dial at once, before any send was counted.
		deadAt string
	}{
		{name: "served", path: "/", wantCode: "200"},
		{name: "refused: body too large", method: "POST", path: "/", body: strings.Repeat("x", 2048), wantCode: "413"},
		{name: "retried elsewhere", path: "/", wantCode: "200", retries: 1, handover: handoverCold,
			upds: []route.Update{{Instances: []route.InstanceInfo{{Pod: "dead", PodUID: "dead", Address: routertest.DeadAddress(t)}}}}},
		{name: "instance error before the head", method: "POST", path: "/", body: "x", wantCode: "502",
			upds: []route.Update{{Instances: []route.InstanceInfo{{Pod: "dead", PodUID: "dead", Address: closingAddress(t)}}}}},
		{name: "instance error after the head", path: "/break", wantCode: "502"},
		{name: "caller gone", path: "/sleep", cancel: 200 * time.Millisecond, wantCode: "499"},
		{name: "timeout", path: "/sleep", wantCode: "504"},
		{name: "handed over mid-answer", path: "/stream", wantCode: "200", handover: handoverAnswer},
		{name: "handed over after a failed send", path: "/", wantCode: "200", retries: 1, handover: handoverRetry, warmDead: true},
		{name: "answered after its only send (--max-attempts 1)", path: "/", wantCode: "503", warmDead: true, maxAttempts: 1, deadAt: "256.0.0.1:80"},
		{name: "upgraded", upgrade: true, wantCode: "101",
			upds: []route.Update{{Instances: []route.InstanceInfo{{Pod: "ws", PodUID: "ws", Address: routertest.UpgradeEcho(t)}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfgUpd := route.Update{Generation: 1, Config: route.Config{ConcurrencyLimit: 1, Timeout: time.Second},
				Instances: []route.InstanceInfo{{Pod: "good", PodUID: "good", Address: good}}}
			upds := append(append([]route.Update(nil), tt.upds...), cfgUpd)
			for i := range upds {
				upds[i].Generation, upds[i].Config = uint64(i+2), cfgUpd.Config
			}
			res := &seqResolver{cache: &route.Cache{}, upds: upds}
			cfg := DefaultOptions()
			cfg.MaxQueue, cfg.MaxInFlight, cfg.MaxBodyBytes = 0, 100, 1024
			cfg.RetryBackoffBase, cfg.RetryBackoffMax = time.Millisecond, time.Millisecond
			if tt.maxAttempts > 0 {
				cfg.MaxAttempts = tt.maxAttempts
			}
			if err := errors.Join(cfg.Validate()...); err != nil {
				t.Fatal(err)
			}
			errs := &errorCount{}
			p := New(cfg, slog.New(errs), NewMetrics(prometheus.NewRegistry()), res.cache, nil, res)
			url := serveProxy(t, p)
			const fn = "default/fn"
			ref := route.Ref{Namespace: "default", Name: "fn"}
			// Cold first: the owner's first answer is cached by a request
			// that then goes its way; the exit under test is the second.
			// A connection per request: one the warm-up had handed over
			// stays with the goroutine path.
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			warm := func() {
				req, _ := http.NewRequestWithContext(t.Context(), "GET", url+"/", nil)
				req.Header.Set(HeaderFunction, fn)
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			switch {
			case tt.warmDead:
				res.cache.Store(ref, route.Update{Generation: 1, Config: cfgUpd.Config,
					Instances: []route.InstanceInfo{{Pod: "dead", PodUID: "dead", Address: cmpOr(tt.deadAt, routertest.DeadAddress(t))}}})
			case len(tt.upds) == 0:
				warm()
			}
			before := requestsOf(t, p.m, fn)
			handoversBefore := 0.0
			if tt.handover != "" {
				handoversBefore = routertest.Counter(p.m.handovers[tt.handover])
			}
			retriesBefore := routertest.Counter(p.m.retries)

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tt.cancel > 0 {
				time.AfterFunc(tt.cancel, cancel)
			}
			if tt.upgrade {
				upgradeThrough(t, url, fn)
			} else {
				var body io.Reader
				if tt.body != "" {
					body = strings.NewReader(tt.body)
				}
				req, _ := http.NewRequestWithContext(ctx, cmpOr(tt.method, "GET"), url+tt.path, body)
				req.Header.Set(HeaderFunction, fn)
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}

			poll.Until(t, pollTimeout, pollInterval, "the request counted as "+tt.wantCode, func(context.Context) error {
				code, all := routertest.Counter(p.m.requests.WithLabelValues(fn, tt.wantCode)), requestsOf(t, p.m, fn)
				return poll.Unmet(code >= 1 && all > before, "%v with %s, %v in all (%v before)", code, tt.wantCode, all, before)
			})
			poll.Until(t, pollTimeout, pollInterval, "the router's in-flight back to 0", func(context.Context) error {
				return poll.Unmet(p.inFlight.Load() == 0, "router in-flight %d", p.inFlight.Load())
			})
			if got := requestsOf(t, p.m, fn) - before; got != 1 {
				t.Errorf("requests_total grew by %v, want 1", got)
			}
			if testForwarder == ForwarderLoop && tt.handover != "" {
				if got := routertest.Counter(p.m.handovers[tt.handover]) - handoversBefore; got != 1 {
					t.Errorf("loop_handovers_total{%s} grew by %v, want 1", tt.handover, got)
				}
			}
			if got := routertest.Counter(p.m.retries) - retriesBefore; got != tt.retries {
				t.Errorf("retries_total grew by %v, want %v", got, tt.retries)
			}
			e, a := res.cache.Lookup(ref)
			if e == nil {
				t.Fatal("no cache entry")
			}
			if got := e.InFlight.Load(); got != 0 {
				t.Errorf("function in-flight = %d, want 0", got)
			}
			for _, in := range a.Instances {
				if got := in.InFlight.Load(); got != 0 {
					t.Errorf("instance %s in-flight = %d, want 0: its slot leaked", in.Pod, got)
				}
			}
			if n := errs.n.Load(); n != 0 {
				t.Errorf("%d errors logged (a lease ended twice?)", n)
			}
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// upgradeThrough upgrades a connection to the router to the echo protocol,
// sends a line and reads it back.
func upgradeThrough(t *testing.T, url, fn string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /upgrade HTTP/1.1\r\nHost: x\r\n%s: %s\r\nConnection: Upgrade\r\nUpgrade: skipper-test\r\n\r\n", HeaderFunction, fn)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	fmt.Fprint(c, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("echo: %q %v", line, err)
	}
}

// closingAddress is an instance that accepts and closes every connection
// at once, before any answer.
func closingAddress(t *testing.T) string {
	t.Helper()
	ln := routertest.Listen(t)
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return ln.Addr().String()
}
