package dataplane

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"skipper.dev/skipper/noderouter/internal/routertest"
)

// testForwarder is the forwarder the router's tests run with:
// SKIPPER_TEST_FORWARDER (loop, h1 or nethttp; make unit runs each), loop
// (the default) when unset.
var testForwarder = cmp.Or(os.Getenv("SKIPPER_TEST_FORWARDER"), ForwarderLoop)

// serveProxy serves p on loopback with the forwarder under test, as run
// does, and returns its URL.
func serveProxy(t testing.TB, p *Proxy) string {
	t.Helper()
	return serveProxyWith(t, p, testForwarder)
}

// serveProxyWith serves p with the forwarder fwd.
func serveProxyWith(t testing.TB, p *Proxy, fwd string) string {
	t.Helper()
	if fwd == ForwarderNethttp {
		ts := httptest.NewServer(p.nethttp)
		t.Cleanup(func() {
			ts.Close()
			p.nethttp.transport.CloseIdleConnections()
		})
		return ts.URL
	}
	ln := routertest.Listen(t)
	handoff := newConnListener(ln.Addr())
	s := newH1Server(p, slog.New(slog.DiscardHandler), handoff)
	if fwd == ForwarderLoop {
		if err := s.startLoops(loopCount(0)); err != nil {
			t.Fatal(err)
		}
	}
	h2 := &http.Server{Handler: p.nethttp}
	done := make(chan error, 2)
	go func() { done <- s.Serve(ln) }()
	go func() { done <- h2.Serve(handoff) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("h1 server shutdown: %v", err)
		}
		_ = h2.Shutdown(ctx)
		for range 2 {
			if err := <-done; !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("serve: %v", err)
			}
		}
		p.pool.close()
	})
	return "http://" + ln.Addr().String()
}

// pollTimeout and pollInterval bound and pace the tests' poll.Until calls.
const pollTimeout, pollInterval = 10 * time.Second, 5 * time.Millisecond
