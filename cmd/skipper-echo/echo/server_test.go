package echo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/controller/instance"
	"skipper.dev/skipper/controller/instance/instancetest"
	"skipper.dev/skipper/tests/golden"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testUID = "0f1e2d3c-uid"

type fixture struct {
	key *instancetest.Key
	srv *Server
	ts  *httptest.Server
}

// newFixture serves NewServer for pod testUID, with a key of its own
// written to its key file when writeKey.
func newFixture(t *testing.T, writeKey bool) *fixture {
	t.Helper()
	f := &fixture{key: instancetest.NewKey(t)}
	if writeKey {
		f.key.Write(t)
	}
	cfg := DefaultConfig()
	cfg.PodUID = testUID
	cfg.PodName = "echo-pool-abc"
	cfg.AssignKey = f.key.Path
	f.srv = NewServer(cfg, slog.New(slog.DiscardHandler))
	f.ts = httptest.NewServer(f.srv)
	t.Cleanup(f.ts.Close)
	return f
}

// body is the JSON of r signed by the fixture's key for this pod, valid a
// minute.
func (f *fixture) body(t *testing.T, r assign.Request) string {
	t.Helper()
	return instancetest.Encode(t, f.key.Sign(t, testUID, r, time.Now(), time.Minute))
}

// echoRequest is an assign of fn with a config.
func echoRequest(fn string) assign.Request {
	return assign.Request{Function: fn, Config: map[string]string{"k": "v"}}
}

func (f *fixture) assign(t *testing.T, body string) (int, map[string]any) {
	t.Helper()
	return instancetest.Assign(t, f.ts.Client(), f.ts.URL, body)
}

func echo(t *testing.T, c *http.Client, req *http.Request) (int, Response) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e Response
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return resp.StatusCode, e
}

func TestEcho(t *testing.T) {
	f := newFixture(t, true)
	req := httptest.NewRequestWithContext(t.Context(), "PUT", f.ts.URL+"/a/b?x=1&x=2", strings.NewReader("hello"))
	req.RequestURI = ""
	req.Header.Set("X-Test", "yes")
	status, got := echo(t, f.ts.Client(), req)
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	if got.Assigned || got.Function != "" {
		t.Errorf("unassigned instance answered assigned=%v function=%q", got.Assigned, got.Function)
	}
	want := Response{
		Method: "PUT", Path: "/a/b", Query: map[string][]string{"x": {"1", "2"}},
		Headers: got.Headers, Host: got.Host, Body: "hello",
		Pod: Pod{Name: "echo-pool-abc", UID: testUID}, Seen: 1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("echo (-want +got):\n%s", diff)
	}
	if got.Headers["X-Test"][0] != "yes" {
		t.Errorf("headers = %v, want X-Test", got.Headers)
	}

	if status, _ := f.assign(t, f.body(t, echoRequest("default/echo"))); status != 200 {
		t.Fatalf("assign: %d", status)
	}
	req = httptest.NewRequestWithContext(t.Context(), "GET", f.ts.URL+"/", nil)
	req.RequestURI = ""
	_, got = echo(t, f.ts.Client(), req)
	if !got.Assigned || got.Function != "default/echo" || got.Config["k"] != "v" {
		t.Errorf("assigned instance answered assigned=%v function=%q Config=%v", got.Assigned, got.Function, got.Config)
	}
}

// TestContractServed: the server serves the instance contract from its
// flags (pod, UID, key file, body limit): an assign, the GET of what it
// holds, a 409 for another function. (TestEcho: an echo after an assign
// names the function and its config. The contract itself: package
// controller/instance.)
func TestContractServed(t *testing.T) {
	f := newFixture(t, true)
	status, m := f.assign(t, f.body(t, echoRequest("default/echo")))
	if diff := cmp.Diff(map[string]any{"ready": true, "function": "default/echo", "pod": "echo-pool-abc", "podUID": testUID}, m); status != http.StatusOK || diff != "" {
		t.Fatalf("assign: %d, body (-want +got):\n%s", status, diff)
	}
	resp, err := f.ts.Client().Get(f.ts.URL + assign.Path + "?pod=" + testUID)
	if err != nil {
		t.Fatal(err)
	}
	var held assign.Assignment
	err = json.NewDecoder(resp.Body).Decode(&held)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || held.Function != "default/echo" {
		t.Errorf("GET %s: %d %+v %v, want 200 default/echo", assign.Path, resp.StatusCode, held, err)
	}
	if status, m := f.assign(t, f.body(t, echoRequest("default/other"))); status != http.StatusConflict || m["reason"] != assign.ReasonAlreadyAssigned || m["function"] != "default/echo" {
		t.Errorf("another function: %d %v, want 409 already_assigned naming default/echo", status, m)
	}
	if status, m := f.assign(t, `{"token":"`+strings.Repeat("a", int(f.srv.cfg.MaxBody))+`"}`); status != http.StatusBadRequest || m["reason"] != "malformed_body" {
		t.Errorf("a body over --max-body: %d %v, want 400 malformed_body", status, m["reason"])
	}
}

// TestEchoSeen: each path's requests are counted, the count bounded in
// paths (issue 30's e2e counts the requests that reached an instance).
func TestEchoSeen(t *testing.T) {
	s := NewServer(DefaultConfig(), slog.New(slog.DiscardHandler))
	for i, want := range []uint64{1, 2, 3} {
		if got := s.see("/a"); got != want {
			t.Fatalf("call %d: seen %d, want %d", i, got, want)
		}
	}
	for i := range maxPaths - 1 {
		if got := s.see(fmt.Sprint("/p", i)); got != 1 {
			t.Fatalf("path %d: seen %d, want 1", i, got)
		}
	}
	if got := s.see("/one-too-many"); got != 0 {
		t.Errorf("path %d: seen %d, want 0 (not counted)", maxPaths+1, got)
	}
	if got := s.see("/a"); got != 4 {
		t.Errorf("a counted path past the bound: seen %d, want 4", got)
	}
}

func TestEchoControls(t *testing.T) {
	f := newFixture(t, true)
	tests := []struct {
		name       string
		target     string
		header     [2]string
		wantStatus int
		minElapsed time.Duration
	}{
		{"status by query", "/?status=503", [2]string{}, 503, 0},
		{"status by header", "/", [2]string{"X-Echo-Status", "418"}, 418, 0},
		{"query wins", "/?status=202", [2]string{"X-Echo-Status", "418"}, 202, 0},
		{"bad status", "/?status=42", [2]string{}, 400, 0},
		{"sleep", "/?sleep=50ms", [2]string{}, 200, 50 * time.Millisecond},
		{"sleep by header", "/", [2]string{"X-Echo-Sleep", "30ms"}, 200, 30 * time.Millisecond},
		{"bad sleep", "/?sleep=forever", [2]string{}, 400, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", f.ts.URL+tt.target, nil)
			if tt.header[0] != "" {
				req.Header.Set(tt.header[0], tt.header[1])
			}
			start := time.Now()
			resp, err := f.ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status = %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if el := time.Since(start); el < tt.minElapsed {
				t.Errorf("answered after %s, want at least %s", el, tt.minElapsed)
			}
		})
	}
}

func TestEchoSleepHonoursCancel(t *testing.T) {
	f := newFixture(t, true)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.ts.URL+"/?sleep=1h", nil)
	start := time.Now()
	if _, err := f.ts.Client().Do(req); err == nil {
		t.Fatal("want an error from the cancelled request")
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("cancelled sleep took %s", el)
	}
}

func TestEchoFail(t *testing.T) {
	f := newFixture(t, true)
	resp, err := f.ts.Client().Get(f.ts.URL + "/?fail=1")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("fail=1 answered %d, want a dropped connection", resp.StatusCode)
	}
}

func TestEchoCutAndStall(t *testing.T) {
	f := newFixture(t, true)
	t.Run("cut", func(t *testing.T) {
		resp, err := f.ts.Client().Get(f.ts.URL + "/?cut=1")
		if err != nil {
			t.Fatalf("cut=1: want headers, got %v", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("cut=1 answered %d", resp.StatusCode)
		}
		b, err := io.ReadAll(resp.Body)
		if err == nil {
			t.Fatalf("cut=1: read the whole body (%d bytes), want it broken", len(b))
		}
		if len(b) == 0 || resp.ContentLength != -1 {
			t.Errorf("cut=1: read %d bytes of a body of length %d, want part of a chunked body", len(b), resp.ContentLength)
		}
	})
	t.Run("stall", func(t *testing.T) {
		start := time.Now()
		resp, err := f.ts.Client().Get(f.ts.URL + "/?stall=200ms")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		headers := time.Since(start)
		var got Response
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatalf("stall: body: %v", err)
		}
		if total := time.Since(start); headers >= 200*time.Millisecond || total < 200*time.Millisecond {
			t.Errorf("stall=200ms: headers after %s, body after %s; want headers first, body after the stall", headers, total)
		}
	})
}

func TestHealthz(t *testing.T) {
	f := newFixture(t, false)
	resp, err := f.ts.Client().Get(f.ts.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("healthz = %d", resp.StatusCode)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	env := map[string]string{"POD_UID": "from-env", "SKIPPER_LISTEN": "127.0.0.1:0", "SKIPPER_POD_NAME": "", "POD_NAME": "pod-env"}
	tests := []struct {
		name    string
		args    []string
		want    func(*Config)
		wantErr string
	}{
		{"env fallbacks", nil, func(c *Config) { c.PodUID, c.Listen, c.PodName = "from-env", "127.0.0.1:0", "pod-env" }, ""},
		{"flags win", []string{"--pod-uid=x", "--listen", ":9"}, func(c *Config) { c.PodUID, c.Listen, c.PodName = "x", ":9", "pod-env" }, ""},
		{"bad", []string{"--pod-uid=", "--max-body=0"}, nil, "--pod-uid is required"},
		{"stray args", []string{"extra"}, nil, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseConfig(tt.args, flagenv.Map(env), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := DefaultConfig()
			tt.want(&want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := Run(t.Context(), []string{"--help"}, flagenv.Map(nil), &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Run(--help) = %v, want flag.ErrHelp", err)
	}
	golden.Check(t, "help.golden", out.Bytes())
	for _, f := range []string{"--listen", "--pod-uid", "--assign-key", "POD_UID", "SKIPPER_LISTEN"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("--help lacks %s:\n%s", f, out.String())
		}
	}
}

// TestServeShutdown checks that cancelling the context drains an in-flight
// request and returns.
func TestServeShutdown(t *testing.T) {
	f := newFixture(t, true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	arrived := make(chan struct{}) // closed when the request is in the handler
	var once sync.Once
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(arrived) })
		f.srv.ServeHTTP(w, r)
	})
	go func() { done <- instance.Serve(ctx, ln, h, 5*time.Second, slog.New(slog.DiscardHandler)) }()

	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	got := make(chan int, 1)
	go func() {
		resp, err := c.Get("http://" + ln.Addr().String() + "/?sleep=200ms")
		if err != nil {
			got <- -1
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	<-arrived
	cancel()
	if s := <-got; s != 200 {
		t.Errorf("in-flight request during shutdown: %d, want 200", s)
	}
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
}

// TestCallersChecked: an instance assigned with callers serves only the
// requests a router says come from one of them (X-Skipper-Caller), and
// answers the others 403 with why. (Which callers an assignment allows,
// and how a repeat assign changes them: instance.TestCallerAllowed.)
func TestCallersChecked(t *testing.T) {
	f := newFixture(t, true)
	if status, m := f.assign(t, f.body(t, assign.Request{Function: "default/private",
		Callers: &assign.Callers{Namespaces: []string{"team-a"}, ServiceAccounts: []string{"team-b/web"}}})); status != http.StatusOK {
		t.Fatalf("assign: %d %v", status, m)
	}
	call := func(caller string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", f.ts.URL+"/hello", nil)
		if caller != "" {
			req.Header.Set(assign.HeaderCaller, caller)
		}
		resp, err := f.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		reason, _ := m["reason"].(string)
		return resp.StatusCode, reason
	}
	for _, tt := range []struct {
		caller string
		status int
		reason string
	}{
		{"team-a/default", 200, ""},
		{"team-b/web", 200, ""},
		{"team-b/batch", 403, "caller_denied"},
		{"team-a", 403, "caller_denied"},
		{"", 403, "caller_unknown"},
	} {
		if status, reason := call(tt.caller); status != tt.status || reason != tt.reason {
			t.Errorf("caller %q: %d %q, want %d %q", tt.caller, status, reason, tt.status, tt.reason)
		}
	}
}

// TestWarm: the warm-up runs every handler it means to (a broken step is
// an error), and leaves the server as it was: unassigned, its key loaded,
// ready for its one claim.
func TestWarm(t *testing.T) {
	f := newFixture(t, true)
	if err := f.srv.Warm(); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	// Unassigned, so it holds no token id either: the holder records an
	// id only with the assignment it accepts.
	if _, ok := f.srv.holder.Assignment(); ok {
		t.Fatal("Warm assigned the server itself")
	}
	// With the key file gone, an assign verifies only with keys Warm
	// loaded (a holder keeps the keys it read); unloaded, it gets 503.
	if err := os.Remove(f.key.Path); err != nil {
		t.Fatal(err)
	}
	if code, m := f.assign(t, f.body(t, echoRequest("default/echo"))); code != http.StatusOK {
		t.Fatalf("assign after Warm, its key file gone: %d %v (want 200: Warm loads the assign key)", code, m)
	}
	// Without the key file the warm-up still runs; the first assign reads it.
	g := newFixture(t, false)
	if err := g.srv.Warm(); err != nil {
		t.Fatalf("Warm without a key file: %v", err)
	}
}

// TestPrefaultHeap: from a heap with every free page handed back to the
// OS, prefaultHeap leaves at least half its bytes as free heap still
// mapped, for the next spans to be carved from.
func TestPrefaultHeap(t *testing.T) {
	debug.FreeOSMemory()
	before := heapFree(t)
	prefaultHeap(prefaultBytes)
	if after := heapFree(t); after < before+prefaultBytes/2 {
		t.Errorf("free heap kept mapped: %d bytes before, %d after, want at least %d more", before, after, prefaultBytes/2)
	}
}

// heapFree reads the runtime's free heap that is still mapped (not
// released to the OS).
func heapFree(t *testing.T) uint64 {
	t.Helper()
	m := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(m)
	if m[0].Value.Kind() != metrics.KindUint64 {
		t.Fatalf("runtime metric %s not supported", m[0].Name)
	}
	return m[0].Value.Uint64()
}
