package noderouter

import (
	"bufio"
	"context"
	"errors"
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

	"skipper.dev/skipper/cmd/skipper-echo/echo"
	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

// deadAfterAccept is an instance that accepts a connection, reads the whole
// request, body included, and closes the connection without an answer.
type deadAfterAccept struct {
	ln       net.Listener
	accepted atomic.Int64
	bodies   chan string
}

func startDeadAfterAccept(t *testing.T) *deadAfterAccept {
	t.Helper()
	d := &deadAfterAccept{ln: routertest.Listen(t), bodies: make(chan string, 16)}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := d.ln.Accept()
			if err != nil {
				return
			}
			d.accepted.Add(1)
			wg.Go(func() {
				defer conn.Close()
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err != nil {
					return
				}
				b, _ := io.ReadAll(req.Body)
				select {
				case d.bodies <- string(b):
				default:
				}
			})
		}
	})
	t.Cleanup(func() {
		d.ln.Close()
		wg.Wait()
	})
	return d
}

func TestDeadAfterAccept(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		method      string
		body        string
		hdr         string // Idempotency-Key
		wantStatus  int
		wantRetries float64
		wantGood    int64 // requests the healthy instance saw
	}{
		{"POST with a body sent: not retried", "POST", "charge the card", "", 502, 0, 0},
		{"POST with a body and an Idempotency-Key, body sent: not retried", "POST", "charge the card", "k-1", 502, 0, 0},
		{"PATCH with a body sent: not retried", "PATCH", "x", "", 502, 0, 0},
		{"GET: retried on the other instance", "GET", "", "", 200, 1, 1},
		{"POST without a body, with an Idempotency-Key: retried", "POST", "", "k-2", 200, 1, 1},
		{"POST without a body: not retried", "POST", "", "", 502, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := startFakeController(t)
			dead := startDeadAfterAccept(t)
			var good atomic.Int64
			cfg := echo.DefaultConfig()
			cfg.PodUID = "good"
			eh := echo.NewServer(cfg, slog.New(slog.DiscardHandler))
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				good.Add(1)
				eh.ServeHTTP(w, r)
			}))
			t.Cleanup(ts.Close)
			h := startRouter(t, fake, nil)
			// One request in flight on the healthy instance makes the two
			// choices take the idle dead one first.
			_, a, _ := h.rt.cache.Store(route.Ref{Namespace: "default", Name: "echo"}, route.Update{Generation: 1, Instances: []route.InstanceInfo{
				{Pod: "pod-good", PodUID: "good", Address: ts.Listener.Addr().String()},
				{Pod: "pod-dead", PodUID: "dead", Address: dead.ln.Addr().String()},
			}})
			a.Instances[0].InFlight.Add(1)

			var rd io.Reader
			if tt.body != "" {
				rd = strings.NewReader(tt.body)
			}
			req, _ := http.NewRequestWithContext(t.Context(), tt.method, h.url+"/", rd)
			req.Header.Set(dataplane.HeaderFunction, "default/echo")
			if tt.hdr != "" {
				req.Header.Set(dataplane.HeaderIdempotencyKey, tt.hdr)
			}
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d (%s)", resp.StatusCode, tt.wantStatus, b)
			}
			if tt.wantStatus == 502 && reasonOf(t, b) != dataplane.ReasonUpstreamError {
				t.Errorf("body %s, want reason %s", b, dataplane.ReasonUpstreamError)
			}
			if dead.accepted.Load() != 1 {
				t.Errorf("the dead instance accepted %d connections, want 1", dead.accepted.Load())
			}
			if tt.body != "" {
				if got := <-dead.bodies; got != tt.body {
					t.Errorf("the dead instance read body %q, want it all: %q", got, tt.body)
				}
			}
			if got := good.Load(); got != tt.wantGood {
				t.Errorf("the healthy instance saw %d requests, want %d", got, tt.wantGood)
			}
			m := h.rt.m
			if got := routertest.Value(t, m.reg, "skipper_noderouter_retries_total"); got != tt.wantRetries {
				t.Errorf("retries_total = %v, want %v", got, tt.wantRetries)
			}
			if got := routertest.Value(t, m.reg, "skipper_noderouter_evictions_total"); got != 0 {
				t.Errorf("evictions_total = %v, want 0 (it accepted: it is alive)", got)
			}
		})
	}
}

// TestBackoffRespectsCancellation: a caller that goes away while the router
// waits to retry ends the wait.
func TestBackoffRespectsCancellation(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("d1", routertest.DeadAddress(t)), inst("d2", routertest.DeadAddress(t))))
	h := startRouter(t, fake, func(c *Config) { c.RetryBackoffBase, c.RetryBackoffMax = time.Hour, time.Hour })
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := h.send(ctx, "GET", "default/echo", "/", "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the caller's deadline", err)
	}
	m := h.rt.m
	poll.Until(t, pollTimeout, pollInterval, "the router to answer the gone caller", func(context.Context) error {
		got := routertest.Value(t, m.reg, "skipper_noderouter_requests_total", "function", "default/echo", "code", "499")
		return poll.Unmet(got == 1, "requests_total{499} = %v", got)
	})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the router waited %v after the caller left", d)
	}
	if got := routertest.Value(t, m.reg, "skipper_noderouter_retries_total"); got != 1 {
		t.Errorf("retries_total = %v, want 1 (the wait was cut short)", got)
	}
}

// TestRequestTimeoutBoundsBackoff: the request timeout ends a backoff too.
func TestRequestTimeoutBoundsBackoff(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("d1", routertest.DeadAddress(t)), inst("d2", routertest.DeadAddress(t))))
	h := startRouter(t, fake, func(c *Config) {
		c.RetryBackoffBase, c.RetryBackoffMax = time.Hour, time.Hour
		c.RequestTimeout = 200 * time.Millisecond
	})
	r := h.call(t, "default/echo")
	if r.status != http.StatusGatewayTimeout || reasonOf(t, r.body) != dataplane.ReasonUpstreamTimeout {
		t.Errorf("status %d %s, want 504 %s", r.status, r.body, dataplane.ReasonUpstreamTimeout)
	}
}

func TestMaxAttempts(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	dead := []*pb.Instance{inst("d1", routertest.DeadAddress(t)), inst("d2", routertest.DeadAddress(t)), inst("d3", routertest.DeadAddress(t)), inst("d4", routertest.DeadAddress(t))}
	fake.handle("default/echo", fixed(1, dead...))
	h := startRouter(t, fake, func(c *Config) { c.MaxAttempts = 2 })
	r := h.call(t, "default/echo")
	if r.status != http.StatusServiceUnavailable || reasonOf(t, r.body) != dataplane.ReasonNoInstances || r.header.Get("Retry-After") == "" {
		t.Errorf("status %d %s %v, want 503 %s with Retry-After", r.status, r.body, r.header, dataplane.ReasonNoInstances)
	}
	m := h.rt.m
	if got := routertest.Value(t, m.reg, "skipper_noderouter_retries_total"); got != 1 {
		t.Errorf("retries_total = %v, want 1 (2 attempts)", got)
	}
	if got := routertest.Value(t, m.reg, "skipper_noderouter_evictions_total"); got != 2 {
		t.Errorf("evictions_total = %v, want 2", got)
	}
}
