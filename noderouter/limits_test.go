package noderouter

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"skipper.dev/skipper/cmd/skipper-echo/echo"
	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

// pollTimeout and pollInterval bound and pace the tests' poll.Until calls.
const pollTimeout, pollInterval = 10 * time.Second, 5 * time.Millisecond

// send makes one request, safe to call from many goroutines.
func (h *harness) send(ctx context.Context, method, fn, path, body string) (int, []byte, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.url+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set(dataplane.HeaderFunction, fn)
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func reasonOf(t *testing.T, b []byte) string {
	t.Helper()
	var body routertest.ErrorBody
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return body.Reason
}

// TestNegativeCacheFlood: 1,000 concurrent requests for an unknown function
// cost at most two GetInstance calls, and a Function created afterwards is
// callable within 2s.
func TestNegativeCacheFlood(t *testing.T) {
	// Not parallel: it bounds how soon a new function answers (2s), and its
	// flood of 1,000 requests would slow the tests beside it.
	fake := startFakeController(t)
	var mu sync.Mutex
	var asked []time.Time
	fake.handle("default/nope", func(context.Context, *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		mu.Lock()
		asked = append(asked, time.Now())
		mu.Unlock()
		return nil, statusNotFound("default/nope")
	})
	const ttl = time.Second // the default
	h := startRouter(t, fake, nil)
	const workers, each = 50, 20
	start := time.Now()
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range workers {
		wg.Go(func() {
			for range each {
				code, _, err := h.send(t.Context(), "GET", "default/nope", "/", "")
				if err != nil || code != http.StatusNotFound {
					bad.Add(1)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if n := bad.Load(); n != 0 {
		t.Errorf("%d requests did not get 404", n)
	}
	mu.Lock()
	calls := slices.Clone(asked)
	mu.Unlock()
	// However long the flood took (the race detector slows it), no window
	// of one TTL holds more than two calls.
	for i := range calls {
		in := 0
		for _, c := range calls[i:] {
			if c.Sub(calls[i]) < ttl {
				in++
			}
		}
		if in > 2 {
			t.Errorf("%d GetInstance calls within %v of call %d, want ≤ 2", in, ttl, i)
		}
	}
	m := h.rt.m
	neg, miss := routertest.Value(t, m.reg, "skipper_noderouter_cache_lookups_total", "result", "negative"), routertest.Value(t, m.reg, "skipper_noderouter_cache_lookups_total", "result", "miss")
	t.Logf("1000 requests in %v: %d GetInstance calls, %v negative hits, %v misses", took, len(calls), neg, miss)
	if neg+miss != workers*each || neg < workers*each/2 {
		t.Errorf("cache_lookups_total negative %v + miss %v, want %d, most of them negative", neg, miss, workers*each)
	}
	if got := routertest.Value(t, m.reg, "skipper_noderouter_requests_total", "function", "", "code", "404"); got != workers*each {
		t.Errorf("requests_total{function=\"\",code=404} = %v, want %d", got, workers*each)
	}
	r := h.call(t, "default/nope")
	if r.status != 404 || reasonOf(t, r.body) != dataplane.ReasonUnknownFunction || r.header.Get("Content-Type") != "application/json" {
		t.Errorf("negative answer: %d %s %q", r.status, r.header.Get("Content-Type"), r.body)
	}

	// The function is created: it answers within 2s (the brief), without
	// anyone flushing the negative cache.
	fake.handle("default/nope", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	created := time.Now()
	poll.Until(t, pollTimeout, pollInterval, "the new function to answer", func(context.Context) error {
		r := h.call(t, "default/nope")
		return poll.Unmet(r.status == 200, "status %d", r.status)
	})
	if d := time.Since(created); d > 2*time.Second {
		t.Errorf("new function callable after %v, want ≤ 2s", d)
	}
}

func TestNegativeCacheOff(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	h := startRouter(t, fake, func(c *Config) { c.NegativeCacheTTL = 0 })
	for range 3 {
		if r := h.call(t, "default/nope"); r.status != 404 {
			t.Fatalf("status %d", r.status)
		}
	}
	if got := len(fake.getCalls()); got != 3 {
		t.Errorf("GetInstance calls = %d, want 3 with the negative cache off", got)
	}
}

// startEchoServer is startEcho returning the server, to kill it.
func startEchoServer(t *testing.T, uid string) *httptest.Server {
	t.Helper()
	cfg := echo.DefaultConfig()
	cfg.PodUID, cfg.PodName = uid, "pod-"+uid
	ts := httptest.NewServer(echo.NewServer(cfg, slog.New(slog.DiscardHandler)))
	t.Cleanup(ts.Close)
	return ts
}

// TestKillInstanceMidLoad kills one of three instances (its listener and
// every connection) under load: no idempotent request is lost.
func TestKillInstanceMidLoad(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	a, b, c := startEchoServer(t, "a"), startEchoServer(t, "b"), startEchoServer(t, "c")
	fake.handle("default/echo", fixed(1,
		inst("a", a.Listener.Addr().String()), inst("b", b.Listener.Addr().String()), inst("c", c.Listener.Addr().String())))
	h := startRouter(t, fake, nil)

	const workers = 8
	var done atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	methods := []string{"GET", "HEAD", "DELETE", "OPTIONS", "PUT"}
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// The sleep keeps requests in flight on the instance when it dies.
				method := methods[(w+i)%len(methods)]
				code, body, err := h.send(t.Context(), method, "default/echo", "/?sleep=1ms", "")
				if err != nil || code != 200 {
					mu.Lock()
					failures = append(failures, method+": "+http.StatusText(code)+" "+string(body)+" "+errString(err))
					mu.Unlock()
				}
				done.Add(1)
			}
		})
	}
	poll.Until(t, pollTimeout, pollInterval, "warm load", func(context.Context) error { return poll.Unmet(done.Load() >= 200, "%d requests done", done.Load()) })
	b.Listener.Close()
	b.CloseClientConnections()
	killed := done.Load()
	poll.Until(t, pollTimeout, pollInterval, "load after the kill", func(context.Context) error {
		return poll.Unmet(done.Load() >= killed+400, "%d requests done", done.Load())
	})
	close(stop)
	wg.Wait()

	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed, e.g. %q", len(failures), done.Load(), failures[0])
	}
	m := h.rt.m
	if got := routertest.Value(t, m.reg, "skipper_noderouter_evictions_total"); got != 1 {
		t.Errorf("evictions_total = %v, want 1 (the killed instance)", got)
	}
	if got := routertest.Value(t, m.reg, "skipper_noderouter_retries_total"); got < 1 {
		t.Errorf("retries_total = %v, want ≥ 1", got)
	}
	if _, as := h.rt.cache.Lookup(route.Ref{Namespace: "default", Name: "echo"}); len(as.Instances) != 2 {
		t.Errorf("instances cached after the kill = %d, want 2", len(as.Instances))
	}
	if got := len(fake.getCalls()); got != 1 {
		t.Errorf("GetInstance calls = %d, want 1 (two instances were left)", got)
	}
	t.Logf("%d requests, %v retries", done.Load(), routertest.Value(t, m.reg, "skipper_noderouter_retries_total"))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestLimits(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	echoAddr := startEcho(t, "uid-1")
	fake.handle("default/echo", fixed(1, inst("uid-1", echoAddr)))
	const limit = 1000
	h := startRouter(t, fake, func(c *Config) { c.MaxBodyBytes = limit })

	t.Run("body within the limit", func(t *testing.T) {
		r := h.do(t, "POST", "/", map[string]string{dataplane.HeaderFunction: "default/echo"}, strings.Repeat("x", limit))
		if got := decodeEcho(t, r); r.status != 200 || len(got.Body) != limit {
			t.Fatalf("status %d, body of %d bytes", r.status, len(got.Body))
		}
	})
	big := strings.Repeat("x", limit+1)
	for _, tt := range []struct {
		name    string
		chunked bool
	}{{"Content-Length over the limit", false}, {"chunked body over the limit", true}} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), "POST", h.url+"/", strings.NewReader(big))
			if tt.chunked {
				req.ContentLength = -1 // unknown: sent chunked
			}
			req.Header.Set(dataplane.HeaderFunction, "default/echo")
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge || resp.Header.Get("Content-Type") != "application/json" || reasonOf(t, b) != dataplane.ReasonBodyTooLarge {
				t.Errorf("status %d %s %s, want 413 JSON %s", resp.StatusCode, resp.Header.Get("Content-Type"), b, dataplane.ReasonBodyTooLarge)
			}
		})
	}
	// A Function's own limit (spec.maxBodyBytes) replaces the router's,
	// lower or higher, from its first call (the limit comes with
	// GetInstance's config) and as the body streams.
	withLimit := func(n int64) func(context.Context, *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		return func(_ context.Context, req *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
			return &pb.GetInstanceResponse{Function: req.GetFunction(), Generation: 1, Owner: "fake",
				Instances: []*pb.Instance{inst("uid-1", echoAddr)}, Config: &pb.FunctionConfig{MaxBodyBytes: n}}, nil
		}
	}
	fake.handle("default/small", withLimit(100))
	fake.handle("default/big", withLimit(5*limit))
	for _, tt := range []struct {
		fn      string
		size    int
		chunked bool
		want    int
	}{
		{"default/small", 101, false, http.StatusRequestEntityTooLarge}, // the first call: refused once the config came
		{"default/small", 101, true, http.StatusRequestEntityTooLarge},
		{"default/small", 100, false, http.StatusOK},
		{"default/small", 100, true, http.StatusOK},
		{"default/big", 3 * limit, false, http.StatusOK}, // over the router's own
		{"default/big", 3 * limit, true, http.StatusOK},
		{"default/big", 5*limit + 1, false, http.StatusRequestEntityTooLarge},
		{"default/big", 5*limit + 1, true, http.StatusRequestEntityTooLarge},
	} {
		t.Run(fmt.Sprintf("%s %d bytes chunked=%v", tt.fn, tt.size, tt.chunked), func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), "POST", h.url+"/", strings.NewReader(strings.Repeat("x", tt.size)))
			if tt.chunked {
				req.ContentLength = -1
			}
			req.Header.Set(dataplane.HeaderFunction, tt.fn)
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d %s, want %d", resp.StatusCode, b, tt.want)
			}
			if tt.want == http.StatusOK {
				if got := decodeEcho(t, reply{status: resp.StatusCode, body: b}); len(got.Body) != tt.size {
					t.Errorf("the instance got %d bytes, want %d", len(got.Body), tt.size)
				}
			}
		})
	}
	t.Run("header over --max-header-bytes", func(t *testing.T) {
		r := h.do(t, "GET", "/", map[string]string{dataplane.HeaderFunction: "default/echo", "X-Big": strings.Repeat("h", 80<<10)}, "")
		if r.status != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("status %d, want 431", r.status)
		}
	})
	if got := routertest.Value(t, h.rt.m.reg, "skipper_noderouter_retries_total"); got != 0 {
		t.Errorf("retries_total = %v, want 0", got)
	}
}

// TestColdStartTimeout: the cold path is bounded by --cold-start-timeout,
// whether the owner is slow to find an instance or never answers at all,
// and ends in a 503 with Retry-After and a JSON reason.
func TestColdStartTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	slow := startFakeController(t)
	slow.handle("default/echo", func(ctx context.Context, _ *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		<-ctx.Done() // no instance becomes ready
		return nil, ctx.Err()
	})
	// mute accepts connections and never says a word: neither the stream
	// nor GetInstance gets anywhere.
	mute := routertest.Listen(t)
	var wg sync.WaitGroup
	wg.Go(func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	})
	t.Cleanup(func() {
		mute.Close()
		wg.Wait()
	})
	for _, tt := range []struct {
		name string
		addr string
	}{{"owner finds no instance", slow.addr}, {"owner never answers", mute.Addr().String()}} {
		t.Run(tt.name, func(t *testing.T) {
			fake := &fakeController{addr: tt.addr}
			h := startRouter(t, fake, func(c *Config) { c.ColdStartTimeout = timeout })
			start := time.Now()
			r := h.call(t, "default/echo")
			took := time.Since(start)
			if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" ||
				r.header.Get("Content-Type") != "application/json" || reasonOf(t, r.body) != dataplane.ReasonColdStartTimeout {
				t.Errorf("answer %d %v %s, want 503 with Retry-After and reason %s", r.status, r.header, r.body, dataplane.ReasonColdStartTimeout)
			}
			if took < timeout || took > timeout+2*time.Second {
				t.Errorf("answered after %v, want about %v", took, timeout)
			}
			if got := routertest.Counter(h.rt.m.getInstance.WithLabelValues(dataplane.ResultDeadlineExceeded)); got != 1 {
				t.Errorf("get_instance_total{deadline_exceeded} = %v, want 1", got)
			}
		})
	}
}
