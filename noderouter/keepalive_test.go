package noderouter

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"skipper.dev/skipper/cmd/skipper-echo/echo"
)

// TestKeepAlivePoolSizedToConcurrency: under steady concurrent load the
// router reuses its connections to an instance instead of opening new ones
// (Go's default keeps 2 idle per host, so most requests would dial).
func TestKeepAlivePoolSizedToConcurrency(t *testing.T) {
	t.Parallel()
	const workers, rounds = 32, 20
	var dials atomic.Int64
	ts := httptest.NewUnstartedServer(echo.NewServer(echo.DefaultConfig(), slog.New(slog.DiscardHandler)))
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	ts.Start()
	t.Cleanup(ts.Close)
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", ts.Listener.Addr().String())))
	h := startRouter(t, fake, nil)
	h.client.Transport.(*http.Transport).MaxIdleConnsPerHost = workers

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range rounds {
				if code, b, err := h.send(t.Context(), "GET", "default/echo", "/", ""); err != nil || code != 200 {
					t.Errorf("status %d %s %v", code, b, err)
					return
				}
			}
		})
	}
	wg.Wait()
	// One connection per concurrent caller, plus a few: the transport may
	// dial for a request that then takes a connection freed meanwhile, and
	// keeps both.
	if got, most := dials.Load(), int64(workers*3/2); got > most {
		t.Errorf("the router opened %d connections to the instance for %d requests from %d concurrent callers; want at most %d",
			got, workers*rounds, workers, most)
	}
}
