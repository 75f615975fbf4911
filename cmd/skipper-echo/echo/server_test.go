package echo

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"skipper.dev/skipper/controller/assign"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testUID = "0f1e2d3c-uid"

type fixture struct {
	priv ed25519.PrivateKey
	pub  []byte
	key  string // path of the public key file
	srv  *Server
	ts   *httptest.Server
}

func newFixture(t *testing.T, writeKey bool) *fixture {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := assign.MarshalPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{priv: priv, pub: pem, key: filepath.Join(t.TempDir(), "ed25519.pub")}
	if writeKey {
		f.writeKey(t)
	}
	cfg := DefaultConfig()
	cfg.PodUID = testUID
	cfg.PodName = "echo-pool-abc"
	cfg.AssignKey = f.key
	f.srv = NewServer(cfg, slog.New(slog.DiscardHandler))
	f.ts = httptest.NewServer(f.srv)
	t.Cleanup(f.ts.Close)
	return f
}

func (f *fixture) writeKey(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(f.key, f.pub, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) token(t *testing.T, aud, fn string, exp time.Duration) string {
	t.Helper()
	now := time.Now()
	tok, err := assign.Sign(f.priv, assign.Claims{Audience: aud, Function: fn, IssuedAt: now.Unix(), Expiry: now.Add(exp).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (f *fixture) assign(t *testing.T, body string) (int, map[string]any) {
	t.Helper()
	resp, err := f.ts.Client().Post(f.ts.URL+assign.Path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return resp.StatusCode, m
}

func assignBody(t *testing.T, tok, fn string) string {
	t.Helper()
	b, err := json.Marshal(assign.Request{Token: tok, Function: fn, Config: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestAssign(t *testing.T) {
	f := newFixture(t, true)
	tests := []struct {
		name       string
		body       func() string
		wantStatus int
		wantReason string
	}{
		{"malformed json", func() string { return "{" }, 400, "malformed_body"},
		{"missing token", func() string { return `{"function":"default/echo"}` }, 400, "malformed_body"},
		{"garbage token", func() string { return assignBody(t, "v1.abc.def", "default/echo") }, 401, "bad_token"},
		{"other pod", func() string {
			return assignBody(t, f.token(t, "someone-else", "default/echo", time.Minute), "default/echo")
		}, 401, "bad_token"},
		{"expired", func() string { return assignBody(t, f.token(t, testUID, "default/echo", -time.Second), "default/echo") }, 401, "bad_token"},
		{"body names another function", func() string { return assignBody(t, f.token(t, testUID, "default/echo", time.Minute), "default/other") }, 401, "bad_token"},
		{"ok", func() string { return assignBody(t, f.token(t, testUID, "default/echo", time.Minute), "default/echo") }, 200, ""},
		{"again, same function", func() string { return assignBody(t, f.token(t, testUID, "default/echo", time.Minute), "default/echo") }, 200, ""},
		{"another function", func() string {
			return assignBody(t, f.token(t, testUID, "default/other", time.Minute), "default/other")
		}, 409, "already_assigned"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, m := f.assign(t, tt.body())
			if status != tt.wantStatus {
				t.Fatalf("status = %d, want %d (body %v)", status, tt.wantStatus, m)
			}
			if tt.wantReason != "" {
				if diff := cmp.Diff(tt.wantReason, m["reason"]); diff != "" {
					t.Errorf("reason (-want +got):\n%s", diff)
				}
				// A 409 names the function the instance holds (issue 15).
				if tt.wantStatus == http.StatusConflict && m["function"] != "default/echo" {
					t.Errorf("409 names function %v, want default/echo", m["function"])
				}
				return
			}
			want := map[string]any{"ready": true, "function": "default/echo", "pod": "echo-pool-abc", "podUID": testUID}
			if diff := cmp.Diff(want, m); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

// TestOneshotAssignOnlyFromItsClaim: a oneshot instance accepts a repeat
// assign only from the claim that won it; another claim of the same
// function gets 409 naming it (two claims must not share one call's
// instance).
func TestOneshotAssignOnlyFromItsClaim(t *testing.T) {
	f := newFixture(t, true)
	body := func(claim string) string {
		b, err := json.Marshal(assign.Request{Token: f.token(t, testUID, "default/once", time.Minute), Function: "default/once", Oneshot: true, Claim: claim})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tt := range []struct {
		claim string
		want  int
	}{{"a", 200}, {"a", 200}, {"b", 409}} {
		status, m := f.assign(t, body(tt.claim))
		if status != tt.want {
			t.Fatalf("claim %s: %d %v, want %d", tt.claim, status, m, tt.want)
		}
		if status == http.StatusConflict && m["function"] != "default/once" {
			t.Errorf("409 names %v, want default/once", m["function"])
		}
	}
}

func TestAssignKeyAppearsLate(t *testing.T) {
	f := newFixture(t, false)
	body := assignBody(t, f.token(t, testUID, "default/echo", time.Minute), "default/echo")
	if status, m := f.assign(t, body); status != http.StatusServiceUnavailable || m["reason"] != "key_unavailable" {
		t.Fatalf("without key: %d %v, want 503 key_unavailable", status, m)
	}
	f.writeKey(t)
	if status, m := f.assign(t, body); status != http.StatusOK {
		t.Fatalf("with key: %d %v, want 200", status, m)
	}
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
		Pod: Pod{Name: "echo-pool-abc", UID: testUID},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("echo (-want +got):\n%s", diff)
	}
	if got.Headers["X-Test"][0] != "yes" {
		t.Errorf("headers = %v, want X-Test", got.Headers)
	}

	if status, _ := f.assign(t, assignBody(t, f.token(t, testUID, "default/echo", time.Minute), "default/echo")); status != 200 {
		t.Fatalf("assign: %d", status)
	}
	req = httptest.NewRequestWithContext(t.Context(), "GET", f.ts.URL+"/", nil)
	req.RequestURI = ""
	_, got = echo(t, f.ts.Client(), req)
	if !got.Assigned || got.Function != "default/echo" || got.Config["k"] != "v" {
		t.Errorf("assigned instance answered assigned=%v function=%q Config=%v", got.Assigned, got.Function, got.Config)
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
	t.Setenv("POD_UID", "from-env")
	t.Setenv("SKIPPER_LISTEN", "127.0.0.1:0")
	tests := []struct {
		name    string
		args    []string
		want    func(*Config)
		wantErr string
	}{
		{"env fallbacks", nil, func(c *Config) { c.PodUID = "from-env"; c.Listen = "127.0.0.1:0" }, ""},
		{"flags win", []string{"--pod-uid=x", "--listen", ":9"}, func(c *Config) { c.PodUID = "x"; c.Listen = ":9" }, ""},
		{"bad", []string{"--pod-uid=", "--max-body=0"}, nil, "--pod-uid is required"},
		{"stray args", []string{"extra"}, nil, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseConfig(tt.args, io.Discard)
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
	var out bytes.Buffer
	if err := Run(t.Context(), []string{"--help"}, &out); err != nil {
		t.Fatal(err)
	}
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
	go func() { done <- serve(ctx, ln, f.srv, 5*time.Second, slog.New(slog.DiscardHandler)) }()

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
	time.Sleep(50 * time.Millisecond) // let the request arrive
	cancel()
	if s := <-got; s != 200 {
		t.Errorf("in-flight request during shutdown: %d, want 200", s)
	}
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
}

// TestCallersChecked: an instance assigned with callers serves only the
// requests a router says come from one of them (X-Skipper-Caller); a
// repeat assign hands over new callers; an instance of a function with
// none serves anyone.
func TestCallersChecked(t *testing.T) {
	f := newFixture(t, true)
	assignWith := func(c *assign.Callers) {
		t.Helper()
		b, err := json.Marshal(assign.Request{Token: f.token(t, testUID, "default/private", time.Minute), Function: "default/private", Callers: c})
		if err != nil {
			t.Fatal(err)
		}
		if status, m := f.assign(t, string(b)); status != http.StatusOK {
			t.Fatalf("assign: %d %v", status, m)
		}
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
	assignWith(&assign.Callers{Namespaces: []string{"team-a"}, ServiceAccounts: []string{"team-b/web"}})
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
	assignWith(&assign.Callers{Namespaces: []string{"team-c"}}) // the Function's callers changed
	if status, _ := call("team-a/default"); status != 403 {
		t.Errorf("a caller the new callers drop: %d, want 403", status)
	}
	if status, _ := call("team-c/x"); status != 200 {
		t.Errorf("a caller the new callers add: %d, want 200", status)
	}
	assignWith(nil) // the Function lists no callers any more
	if status, _ := call(""); status != 200 {
		t.Errorf("no callers listed, a request without %s: %d, want 200", assign.HeaderCaller, status)
	}
}

// TestAssignmentAnswered: GET on the assign endpoint says what the
// instance holds, read-only: nothing (404 unassigned), then the function
// assigned; asked as another pod, 404 other_pod.
func TestAssignmentAnswered(t *testing.T) {
	f := newFixture(t, true)
	get := func(query string) (int, map[string]any) {
		t.Helper()
		resp, err := f.ts.Client().Get(f.ts.URL + assign.Path + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	if status, m := get("?pod=" + testUID); status != http.StatusNotFound || m["reason"] != assign.ReasonUnassigned {
		t.Errorf("unassigned: %d %v", status, m)
	}
	if status, m := f.assign(t, assignBody(t, f.token(t, testUID, "default/echo", time.Minute), "default/echo")); status != http.StatusOK {
		t.Fatalf("assign: %d %v", status, m)
	}
	if status, m := get("?pod=" + testUID); status != http.StatusOK || m["function"] != "default/echo" {
		t.Errorf("assigned: %d %v", status, m)
	}
	if status, m := get(""); status != http.StatusOK || m["function"] != "default/echo" {
		t.Errorf("assigned, asked without a pod: %d %v", status, m)
	}
	if status, m := get("?pod=someone-else"); status != http.StatusNotFound || m["reason"] != assign.ReasonOtherPod {
		t.Errorf("asked as another pod: %d %v", status, m)
	}
}
