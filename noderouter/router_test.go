package noderouter

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"skipper.dev/skipper/cmd/skipper-echo/echo"
	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/internal/routertest"
	pb "skipper.dev/skipper/proto/skipperv1"
)

func TestMain(m *testing.M) {
	if os.Getenv(steerChildEnv) != "" {
		os.Exit(steerChild()) // re-executed as a caller by the BPF tests
	}
	goleak.VerifyTestMain(m)
}

type harness struct {
	fake   *fakeController
	rt     *router
	url    string
	admin  string
	client *http.Client
}

// startRouter runs a router against fake (static members) on loopback until
// the test ends. prep, if any, adjusts the router before it runs.
// testForwarder is the forwarder the router's tests run with:
// SKIPPER_TEST_FORWARDER (loop, h1 or nethttp; make unit runs each), loop
// (the default) when unset.
var testForwarder = func() string {
	if f := os.Getenv("SKIPPER_TEST_FORWARDER"); f != "" {
		return f
	}
	return dataplane.ForwarderLoop
}()

func startRouter(t *testing.T, fake *fakeController, mutate func(*Config), prep ...func(*router)) *harness {
	t.Helper()
	cfg := DefaultConfig()
	cfg.NodeName = "node1"
	cfg.PodName, cfg.PodNamespace = "router-x", "skipper-system"
	cfg.ControllerAddresses = []string{fake.addr}
	cfg.ReportInterval = 20 * time.Millisecond
	cfg.ReconnectMin, cfg.ReconnectMax = 10*time.Millisecond, 50*time.Millisecond
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.DrainDelay = 0
	cfg.Forwarder = testForwarder
	if mutate != nil {
		mutate(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	data := routertest.Listen(t)
	admin := routertest.Listen(t)
	rt := newRouter(cfg, slog.New(slog.DiscardHandler))
	for _, p := range prep {
		p(rt)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		// Every goroutine of this router carries the test's name, for
		// waitingIn.
		pprof.SetGoroutineLabels(pprof.WithLabels(ctx, pprof.Labels(testLabel, t.Name())))
		done <- rt.run(ctx, data, admin, nil)
	}()
	tr := &http.Transport{}
	t.Cleanup(func() {
		// Close the client's idle connections first: a connection the client
		// dialled but never used is StateNew on the server, and
		// http.Server.Shutdown waits 5s before it counts such a connection as
		// idle (net/http issue 22682), longer than ShutdownTimeout here.
		tr.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router run: %v", err)
		}
	})
	return &harness{fake: fake, rt: rt, url: "http://" + data.Addr().String(), admin: "http://" + admin.Addr().String(), client: &http.Client{Transport: tr}}
}

// testLabel is the goroutine label startRouter gives a router's
// goroutines: the test's name.
const testLabel = "test"

// waitingIn counts the goroutines of t's router (startRouter) blocked in a
// select in fn, a function name as runtime.FuncForPC gives it.
func waitingIn(t *testing.T, fn string) int {
	t.Helper()
	var b strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		t.Fatal(err)
	}
	// Each stack: "<count> @ <pc> <pc>...", innermost first (runtime frames
	// included, unlike the symbolised lines below), then "# labels: {...}".
	label := fmt.Sprintf("# labels: {%q:%q}", testLabel, t.Name())
	name := func(pc string) string {
		v, err := strconv.ParseUint(pc, 0, 64)
		if f := runtime.FuncForPC(uintptr(v) - 1); err == nil && f != nil {
			return f.Name()
		}
		return ""
	}
	n := 0
	for stack := range strings.SplitSeq(b.String(), "\n\n") {
		lines := strings.Split(stack, "\n")
		if len(lines) < 2 || lines[1] != label {
			continue
		}
		count, pcs, _ := strings.Cut(lines[0], " @ ")
		f := strings.Fields(pcs)
		if len(f) < 3 || name(f[0]) != "runtime.gopark" || name(f[1]) != "runtime.selectgo" || name(f[2]) != fn {
			continue
		}
		c, err := strconv.Atoi(count)
		if err != nil {
			t.Fatalf("goroutine profile: %q", lines[0])
		}
		n += c
	}
	return n
}

// startEcho runs the real skipper-echo handler as pod uid and returns its
// address.
func startEcho(t *testing.T, uid string) string {
	t.Helper()
	cfg := echo.DefaultConfig()
	cfg.PodUID, cfg.PodName = uid, "pod-"+uid
	ts := httptest.NewServer(echo.NewServer(cfg, slog.New(slog.DiscardHandler)))
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String()
}

func inst(uid, addr string) *pb.Instance {
	return &pb.Instance{Pod: "pod-" + uid, PodUid: uid, Address: addr, Node: "node1"}
}

// fixed answers GetInstance with one instance set.
func fixed(gen uint64, ins ...*pb.Instance) func(context.Context, *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
	return func(_ context.Context, req *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		return &pb.GetInstanceResponse{Function: req.GetFunction(), Generation: gen, Instances: ins, Owner: "fake"}, nil
	}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (h *harness) do(t *testing.T, method, path string, hdr map[string]string, body string) reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, h.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

func (h *harness) call(t *testing.T, fn string) reply {
	t.Helper()
	return h.do(t, "GET", "/hello", map[string]string{"X-Skipper-Function": fn}, "")
}

func decodeEcho(t *testing.T, r reply) echo.Response {
	t.Helper()
	var e echo.Response
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("status %d, body %q: %v", r.status, r.body, err)
	}
	return e
}

func TestColdThenWarm(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	h := startRouter(t, fake, nil)

	r := h.do(t, "POST", "/hello?x=1", map[string]string{"X-Skipper-Function": "default/echo", "X-Forwarded-For": "203.0.113.9"}, "ping")
	if r.status != 200 {
		t.Fatalf("cold call: %d %s", r.status, r.body)
	}
	got := decodeEcho(t, r)
	if got.Pod.UID != "uid-1" || got.Path != "/hello" || got.Body != "ping" || got.Method != "POST" {
		t.Errorf("echo = %+v", got)
	}
	if _, ok := got.Headers["X-Skipper-Function"]; ok {
		t.Errorf("x-skipper-function reached the instance: %v", got.Headers)
	}
	if xff := got.Headers["X-Forwarded-For"]; len(xff) != 1 || xff[0] != "203.0.113.9, 127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q, want the caller's chain plus this hop", xff)
	}
	if got.Headers["X-Forwarded-Proto"][0] != "http" || got.Host != strings.TrimPrefix(h.url, "http://") {
		t.Errorf("X-Forwarded-Proto %v, Host %q", got.Headers["X-Forwarded-Proto"], got.Host)
	}

	for range 3 {
		if r := h.call(t, "default/echo"); r.status != 200 {
			t.Fatalf("warm call: %d %s", r.status, r.body)
		}
	}
	calls := fake.getCalls()
	if len(calls) != 1 {
		t.Fatalf("GetInstance calls = %d, want 1 (warm requests must not ask)", len(calls))
	}
	wantReq := &pb.GetInstanceRequest{
		Function: &pb.FunctionRef{Namespace: "default", Name: "echo"},
		Router:   h.rt.cp.id,
		Caller:   &pb.Caller{Unknown: true}, // static members: no caller index
	}
	if diff := cmp.Diff(wantReq.String(), calls[0].String()); diff != "" {
		t.Errorf("GetInstance request (-want +got):\n%s", diff)
	}
	m := h.rt.m
	// A request is counted as its answer goes out, not before the caller
	// has it.
	poll.Until(t, pollTimeout, pollInterval, "the fourth request counted", func(context.Context) error {
		got := routertest.Value(t, m.reg, "skipper_noderouter_function_request_seconds", "function", "default/echo")
		return poll.Unmet(got == 4, "%v counted", got)
	})
	for name, c := range map[string]struct{ got, want float64 }{
		"get_instance ok":   {routertest.Counter(m.getInstance.WithLabelValues(dataplane.ResultOK)), 1},
		"cache hit":         {routertest.Value(t, m.reg, "skipper_noderouter_cache_lookups_total", "result", "hit"), 3},
		"cache miss":        {routertest.Value(t, m.reg, "skipper_noderouter_cache_lookups_total", "result", "miss"), 1},
		"requests 200":      {routertest.Value(t, m.reg, "skipper_noderouter_requests_total", "function", "default/echo", "code", "200"), 4},
		"function latency":  {routertest.Value(t, m.reg, "skipper_noderouter_function_request_seconds", "function", "default/echo"), 4},
		"get_instance 404s": {routertest.Counter(m.getInstance.WithLabelValues(dataplane.ResultNotFound)), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", name, c.got, c.want)
		}
	}
}

func TestHostAddressing(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("team-a/hello", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	h := startRouter(t, fake, func(c *Config) { c.DefaultNamespace = "team-a" })

	// The .fn form, and the names of the Function's own Service (an
	// ExternalName of the router's), as a caller's client sends them.
	for _, host := range []string{"hello.team-a.fn:8380", "hello.team-a", "hello.team-a.svc", "hello.team-a.svc.cluster.local", "HELLO.team-a.svc.cluster.local.:80"} {
		r := h.do(t, "GET", "/", map[string]string{"Host": host}, "")
		if got := decodeEcho(t, r); r.status != 200 || got.Host != host {
			t.Fatalf("by host %q: %d, host %q", host, r.status, got.Host)
		}
	}
	if r := h.call(t, "hello"); r.status != 200 {
		t.Fatalf("bare name with default namespace: %d %s", r.status, r.body)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/full", func(context.Context, *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		return nil, status.Error(codes.ResourceExhausted, "pool echo is empty")
	})
	fake.handle("default/bad", func(context.Context, *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		return nil, status.Error(codes.InvalidArgument, "bad name")
	})
	fake.handle("default/nobody", func(context.Context, *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		return nil, status.Error(codes.Unavailable, "owner is gone")
	})
	fake.handle("default/slow", func(ctx context.Context, _ *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	})
	fake.handle("default/empty", fixed(3))
	h := startRouter(t, fake, func(c *Config) { c.ColdStartTimeout = 100 * time.Millisecond })

	tests := []struct {
		name       string
		hdr        map[string]string
		wantStatus int
		wantReason string
		retryAfter bool
	}{
		{"missing", nil, 400, dataplane.ReasonMissingFunction, false},
		{"host not a function", map[string]string{"Host": "www.example.com"}, 400, dataplane.ReasonMissingFunction, false},
		{"malformed header", map[string]string{"X-Skipper-Function": "Default/Echo"}, 400, dataplane.ReasonMalformedFunction, false},
		{"bare name without default namespace", map[string]string{"X-Skipper-Function": "echo"}, 400, dataplane.ReasonMalformedFunction, false},
		{"malformed host", map[string]string{"Host": "a.b.c.fn"}, 400, dataplane.ReasonMalformedFunction, false},
		{"unknown", map[string]string{"X-Skipper-Function": "default/nope"}, 404, dataplane.ReasonUnknownFunction, false},
		{"invalid argument", map[string]string{"X-Skipper-Function": "default/bad"}, 400, dataplane.ReasonMalformedFunction, false},
		{"resource exhausted", map[string]string{"X-Skipper-Function": "default/full"}, 503, dataplane.ReasonNoCapacity, true},
		{"unavailable", map[string]string{"X-Skipper-Function": "default/nobody"}, 503, dataplane.ReasonNoController, true},
		{"cold start timeout", map[string]string{"X-Skipper-Function": "default/slow"}, 503, dataplane.ReasonColdStartTimeout, true},
		{"no instances", map[string]string{"X-Skipper-Function": "default/empty"}, 503, dataplane.ReasonNoInstances, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.do(t, "GET", "/", tt.hdr, "")
			if r.status != tt.wantStatus {
				t.Fatalf("status = %d, want %d (%s)", r.status, tt.wantStatus, r.body)
			}
			var body routertest.ErrorBody
			if err := json.Unmarshal(r.body, &body); err != nil {
				t.Fatalf("body %q: %v", r.body, err)
			}
			if body.Reason != tt.wantReason || body.Error == "" {
				t.Errorf("body = %+v, want reason %q and a message", body, tt.wantReason)
			}
			if got := r.header.Get("Retry-After") != ""; got != tt.retryAfter {
				t.Errorf("Retry-After present = %v, want %v", got, tt.retryAfter)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
		})
	}
	m := h.rt.m
	if got := routertest.Counter(m.getInstance.WithLabelValues(dataplane.ResultResourceExhausted)); got != 1 {
		t.Errorf("get_instance_total{resource_exhausted} = %v, want 1", got)
	}
	if got := routertest.Value(t, m.reg, "skipper_noderouter_requests_total", "function", "", "code", "404"); got != 1 {
		t.Errorf("requests_total{function=\"\",code=404} = %v, want 1 (unknown names are not labelled)", got)
	}
	if got := routertest.Value(t, m.reg, "skipper_noderouter_requests_total", "function", "default/full", "code", "503"); got != 1 {
		t.Errorf("requests_total{default/full,503} = %v, want 1", got)
	}
}

func TestDialFailureEvictsAndAsksAgain(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	good := startEcho(t, "uid-good")
	var n int
	var mu sync.Mutex
	fake.handle("default/flaky", func(_ context.Context, req *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		n++
		if n == 1 {
			return &pb.GetInstanceResponse{Generation: 1, Instances: []*pb.Instance{inst("uid-dead", routertest.DeadAddress(t))}}, nil
		}
		return &pb.GetInstanceResponse{Generation: 2, Instances: []*pb.Instance{inst("uid-good", good)}}, nil
	})
	h := startRouter(t, fake, nil)

	r := h.do(t, "PUT", "/", map[string]string{"X-Skipper-Function": "default/flaky"}, "body survives a retry")
	if r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	if got := decodeEcho(t, r); got.Pod.UID != "uid-good" || got.Body != "body survives a retry" {
		t.Errorf("answered by %s with body %q", got.Pod.UID, got.Body)
	}
	calls := fake.getCalls()
	if len(calls) != 2 {
		t.Fatalf("GetInstance calls = %d, want 2", len(calls))
	}
	if diff := cmp.Diff([]string{"uid-dead"}, calls[1].GetUnusablePodUids()); diff != "" {
		t.Errorf("unusable pods (-want +got):\n%s", diff)
	}
	if calls[1].GetKnownGeneration() != 1 {
		t.Errorf("known generation = %d, want 1", calls[1].GetKnownGeneration())
	}
	if got := routertest.Value(t, h.rt.m.reg, "skipper_noderouter_retries_total"); got != 1 {
		t.Errorf("retries_total = %v, want 1", got)
	}
	if r := h.call(t, "default/flaky"); r.status != 200 || len(fake.getCalls()) != 2 {
		t.Errorf("warm call after the retry: %d, %d GetInstance calls", r.status, len(fake.getCalls()))
	}
}

func TestDialFailureRetriesCachedInstance(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-good", startEcho(t, "uid-good")), inst("uid-dead", routertest.DeadAddress(t))))
	h := startRouter(t, fake, nil)
	// The pick is random: call until the dead instance was drawn (each call
	// draws it with probability 1/2) and check every call succeeded.
	for i := 0; routertest.Value(t, h.rt.m.reg, "skipper_noderouter_evictions_total") == 0; i++ {
		if i == 64 {
			t.Fatal("the dead instance was never picked")
		}
		r := h.call(t, "default/echo")
		if got := decodeEcho(t, r); r.status != 200 || got.Pod.UID != "uid-good" {
			t.Fatalf("status %d from %q", r.status, got.Pod.UID)
		}
	}
	if got := len(fake.getCalls()); got != 1 {
		t.Errorf("GetInstance calls = %d, want 1 (another cached instance was there)", got)
	}
	if got := routertest.Value(t, h.rt.m.reg, "skipper_noderouter_retries_total"); got != 1 {
		t.Errorf("retries_total = %v, want 1", got)
	}
}

func TestConcurrentMissesShareOneCall(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	addr := startEcho(t, "uid-1")
	release := make(chan struct{})
	fake.handle("default/echo", func(_ context.Context, req *pb.GetInstanceRequest) (*pb.GetInstanceResponse, error) {
		<-release
		return fixed(1, inst("uid-1", addr))(context.Background(), req)
	})
	h := startRouter(t, fake, nil)
	const n = 8
	var wg sync.WaitGroup
	codes := make(chan int, n)
	for range n {
		wg.Go(func() { codes <- h.call(t, "default/echo").status })
	}
	poll.Until(t, pollTimeout, pollInterval, "the first GetInstance", fake.holds(func(f *fakeController) error { return poll.Unmet(len(f.calls) > 0, "%d calls", len(f.calls)) }))
	// Every request waits for the shared call.
	poll.Until(t, pollTimeout, pollInterval, "every request waiting for the call", func(context.Context) error {
		w := waitingIn(t, "skipper.dev/skipper/noderouter.(*controlPlane).Resolve")
		return poll.Unmet(w == n, "%d of %d waiting", w, n)
	})
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Errorf("status %d", c)
		}
	}
	if got := len(fake.getCalls()); got != 1 {
		t.Errorf("GetInstance calls = %d, want 1", got)
	}
}
