package noderouter

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

func TestH2C(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	h := startRouter(t, fake, nil)
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protocols}
	t.Cleanup(tr.CloseIdleConnections)
	for range 2 {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", h.url+"/h2", strings.NewReader("over h2c"))
		req.Header.Set(dataplane.HeaderFunction, "default/echo")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
			t.Fatalf("status %d over %s: %s", resp.StatusCode, resp.Proto, b)
		}
		if got := decodeEcho(t, reply{status: resp.StatusCode, body: b}); got.Body != "over h2c" {
			t.Errorf("body %q", got.Body)
		}
	}
}

func TestForwardedHeaders(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	h := startRouter(t, fake, nil)
	r := h.do(t, "GET", "/", map[string]string{
		"X-Skipper-Function": "default/echo",
		"Forwarded":          "for=203.0.113.9;proto=https",
		"X-Forwarded-Proto":  "https",
		"X-Forwarded-Host":   "api.example.com",
		"Connection":         "X-Hop",
		"X-Hop":              "must not pass",
	}, "")
	got := decodeEcho(t, r).Headers
	host := strings.TrimPrefix(h.url, "http://")
	want := map[string][]string{
		"Forwarded":         {"for=203.0.113.9;proto=https", `for=127.0.0.1;host="` + host + `";proto=http`},
		"X-Forwarded-Proto": {"https"},
		"X-Forwarded-Host":  {"api.example.com"},
		"X-Forwarded-For":   {"127.0.0.1"},
	}
	for k, v := range want {
		if diff := cmp.Diff(v, got[k]); diff != "" {
			t.Errorf("%s (-want +got):\n%s", k, diff)
		}
	}
	for _, k := range []string{"X-Hop", "X-Skipper-Function", "Connection"} {
		if v, ok := got[k]; ok {
			t.Errorf("%s reached the instance: %q", k, v)
		}
	}
}

func TestUpgradePassThrough(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/ws", func(_ context.Context, req *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		return &pb.GetInstanceResponse{Generation: 1, Instances: []*pb.Instance{inst("uid-ws", routertest.UpgradeEcho(t))},
			Config: &pb.FunctionConfig{ConcurrencyLimit: 1}}, nil
	})
	h := startRouter(t, fake, func(c *Config) { c.MaxQueue = 0 })
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "GET /socket HTTP/1.1\r\nHost: ws.default.fn\r\nConnection: Upgrade\r\nUpgrade: skipper-test\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 101 || resp.Header.Get("Upgrade") != "skipper-test" {
		t.Fatalf("status %d, Upgrade %q", resp.StatusCode, resp.Header.Get("Upgrade"))
	}
	for _, msg := range []string{"ping\n", "pong\n"} {
		_, _ = io.WriteString(conn, msg)
		got, err := br.ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echoed %q, %v; want %q", got, err, msg)
		}
	}
	// The upgraded connection holds its instance's slot while it lasts.
	if r := h.do(t, "GET", "/", map[string]string{"Host": "ws.default.fn"}, ""); r.status != 503 {
		t.Errorf("second request at concurrencyLimit 1 while the socket is open: %d, want 503", r.status)
	}
}

// TestLastReportOnShutdown: stopping the router drains the in-flight
// request and then sends one last report with the final counters.
func TestLastReportOnShutdown(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	cfg := DefaultConfig()
	cfg.NodeName, cfg.PodName = "node1", "router-x"
	cfg.ControllerAddresses = []string{fake.addr}
	cfg.DrainDelay = 0
	cfg.ReportInterval = time.Hour // only the last report
	data, admin := routertest.Listen(t), routertest.Listen(t)
	rt := newRouter(cfg, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.run(ctx, data, admin, nil) }()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	call := func(path string) int {
		req, _ := http.NewRequest("GET", "http://"+data.Addr().String()+path, nil)
		req.Header.Set(dataplane.HeaderFunction, "default/echo")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return -1
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := call("/"); c != 200 {
		t.Fatalf("status %d", c)
	}
	slow := make(chan int, 1)
	go func() { slow <- call("/?sleep=300ms") }()
	poll.Until(t, pollTimeout, pollInterval, "the slow request in flight", func(context.Context) error {
		e, _ := rt.cache.Lookup(route.Ref{Namespace: "default", Name: "echo"})
		return poll.Unmet(e.InFlight.Load() == 1, "%d in flight", e.InFlight.Load())
	})
	tr.CloseIdleConnections()
	cancel()
	if c := <-slow; c != 200 {
		t.Errorf("in-flight request at shutdown: %d", c)
	}
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	// Sent before run returned; the fake may still be reading it.
	poll.Until(t, pollTimeout, pollInterval, "the last report", fake.holds(func(f *fakeController) error { return poll.Unmet(len(f.reports) > 0, "%d reports", len(f.reports)) }))
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.reports) != 1 {
		t.Fatalf("reports = %d, want exactly the last one", len(fake.reports))
	}
	fr := fake.reports[0].GetFunctions()
	if len(fr) != 1 || fr[0].GetRequestsTotal() != 2 || fr[0].GetInFlight() != 0 {
		t.Errorf("last report = %v; want 2 requests, none in flight", fr)
	}
}
