package echo

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/tests/golden"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testUID = "0f1e2d3c-uid"

type fixture struct {
	priv ed25519.PrivateKey
	pub  []byte
	key  string // path of the public key file
	now  func() time.Time
	srv  *Server
	ts   *httptest.Server
}

func newFixture(t *testing.T, writeKey bool) *fixture {
	t.Helper()
	return newFixtureWith(t, writeKey, nil)
}

// newFixtureWith is newFixture with setup applied to the server before it
// serves (its clock, its id memory).
func newFixtureWith(t *testing.T, writeKey bool, setup func(*Server)) *fixture {
	t.Helper()
	priv, pem := newKey(t)
	f := &fixture{priv: priv, pub: pem, key: filepath.Join(t.TempDir(), "ed25519.pub")}
	if writeKey {
		f.writeKey(t)
	}
	cfg := DefaultConfig()
	cfg.PodUID = testUID
	cfg.PodName = "echo-pool-abc"
	cfg.AssignKey = f.key
	f.srv = NewServer(cfg, slog.New(slog.DiscardHandler))
	if setup != nil {
		setup(f.srv)
	}
	f.now = f.srv.now
	f.ts = httptest.NewServer(f.srv)
	t.Cleanup(f.ts.Close)
	return f
}

func newKey(t *testing.T) (ed25519.PrivateKey, []byte) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := assign.MarshalPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return priv, pem
}

func (f *fixture) writeKey(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(f.key, f.pub, 0o644); err != nil {
		t.Fatal(err)
	}
}

// token is an unbound token (no id, no digest), as controllers before
// issue 16 signed.
func (f *fixture) token(t *testing.T, aud, fn string, exp time.Duration) string {
	t.Helper()
	now := f.now()
	tok, err := assign.Sign(f.priv, assign.Claims{Audience: aud, Function: fn, IssuedAt: now.Unix(), Expiry: now.Add(exp).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// signed is r with a token for aud signed by key, valid for exp.
func (f *fixture) signed(t *testing.T, key ed25519.PrivateKey, aud string, r assign.Request, exp time.Duration) assign.Request {
	t.Helper()
	tok, err := assign.SignRequest(key, aud, r, f.now(), exp)
	if err != nil {
		t.Fatal(err)
	}
	r.Token = tok
	return r
}

// body is the JSON of r signed by the fixture's key for this pod, valid a
// minute.
func (f *fixture) body(t *testing.T, r assign.Request) string {
	t.Helper()
	return encode(t, f.signed(t, f.priv, testUID, r, time.Minute))
}

func encode(t *testing.T, r assign.Request) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// echoRequest is the request TestAssign assigns.
func echoRequest(fn string) assign.Request {
	return assign.Request{Function: fn, Config: map[string]string{"k": "v"}}
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
	first := f.body(t, echoRequest("default/echo"))
	changed := func(change func(*assign.Request)) func() string {
		return func() string {
			r := f.signed(t, f.priv, testUID, echoRequest("default/echo"), time.Minute)
			change(&r)
			return encode(t, r)
		}
	}
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
			return encode(t, f.signed(t, f.priv, "someone-else", echoRequest("default/echo"), time.Minute))
		}, 401, "bad_token"},
		{"expired", func() string {
			return encode(t, f.signed(t, f.priv, testUID, echoRequest("default/echo"), -time.Second))
		}, 401, "expired"},
		{"another key", func() string {
			other, _ := newKey(t)
			return encode(t, f.signed(t, other, testUID, echoRequest("default/echo"), time.Minute))
		}, 401, "bad_token"},
		{"body names another function", changed(func(r *assign.Request) { r.Function = "default/other" }), 401, "bad_token"},
		{"config changed", changed(func(r *assign.Request) { r.Config["k"] = "evil" }), 401, "bad_token"},
		{"callers widened", changed(func(r *assign.Request) { r.Callers = &assign.Callers{Namespaces: []string{"attacker"}} }), 401, "bad_token"},
		{"made oneshot", changed(func(r *assign.Request) { r.Oneshot = true }), 401, "bad_token"},
		{"timeout stretched", changed(func(r *assign.Request) { r.TimeoutSeconds = 86400 }), 401, "bad_token"},
		{"unbound token", func() string { return assignBody(t, f.token(t, testUID, "default/echo", time.Minute), "default/echo") }, 401, "bad_token"},
		{"ok", func() string { return first }, 200, ""},
		{"replayed", func() string { return first }, 401, "replayed"},
		{"a fresh token, same function", func() string { return f.body(t, echoRequest("default/echo")) }, 200, ""},
		{"another function", func() string { return f.body(t, echoRequest("default/other")) }, 409, "already_assigned"},
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
		return f.body(t, assign.Request{Function: "default/once", Oneshot: true, Claim: claim})
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
	body := f.body(t, echoRequest("default/echo"))
	if status, m := f.assign(t, body); status != http.StatusServiceUnavailable || m["reason"] != "key_unavailable" {
		t.Fatalf("without key: %d %v, want 503 key_unavailable", status, m)
	}
	f.writeKey(t)
	if status, m := f.assign(t, body); status != http.StatusOK {
		t.Fatalf("with key: %d %v, want 200", status, m)
	}
}

// fakeClock is a settable time for the server and the tokens the test
// signs, safe to read from the server's goroutines.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Unix(1_800_000_000, 0).UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// config is the config the instance echoes back it holds.
func (f *fixture) config(t *testing.T) map[string]string {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), "GET", f.ts.URL+"/", nil)
	req.RequestURI = ""
	_, got := echo(t, f.ts.Client(), req)
	return got.Config
}

// TestAssignRefusedChangesNothing: a replayed token, or a fresh one whose
// body was changed, is refused and leaves the assignment as it was; a
// fresh token for the function held hands over its request.
func TestAssignRefusedChangesNothing(t *testing.T) {
	f := newFixture(t, true)
	v1 := f.body(t, assign.Request{Function: "default/echo", Config: map[string]string{"v": "1"}})
	if status, m := f.assign(t, v1); status != http.StatusOK {
		t.Fatalf("first assign: %d %v", status, m)
	}
	if status, m := f.assign(t, f.body(t, assign.Request{Function: "default/echo", Config: map[string]string{"v": "2"}})); status != http.StatusOK {
		t.Fatalf("a fresh token with a newer config: %d %v, want 200", status, m)
	}
	if status, m := f.assign(t, v1); status != http.StatusUnauthorized || m["reason"] != assign.ReasonReplayed {
		t.Fatalf("the first token again: %d %v, want 401 replayed", status, m)
	}
	tampered := f.signed(t, f.priv, testUID, assign.Request{Function: "default/echo", Config: map[string]string{"v": "3"}}, time.Minute)
	tampered.Config["v"] = "evil"
	if status, m := f.assign(t, encode(t, tampered)); status != http.StatusUnauthorized || m["reason"] != assign.ReasonBadToken ||
		!strings.Contains(m["error"].(string), "request does not match its token") {
		t.Fatalf("a changed body: %d %v, want 401 bad_token", status, m)
	}
	if diff := cmp.Diff(map[string]string{"v": "2"}, f.config(t)); diff != "" {
		t.Errorf("config after the refusals (-want +got):\n%s", diff)
	}
}

// TestAssignKeyRotation: the key file is read again at an assign at most
// once a second; a key added to it verifies from then on, a key dropped
// stops, and a bad file keeps the keys last read.
func TestAssignKeyRotation(t *testing.T) {
	clock := newFakeClock()
	f := newFixtureWith(t, true, func(s *Server) { s.now = clock.now })
	next, nextPEM := newKey(t)
	assignWith := func(key ed25519.PrivateKey) (int, map[string]any) {
		t.Helper()
		return f.assign(t, encode(t, f.signed(t, key, testUID, echoRequest("default/echo"), time.Minute)))
	}
	write := func(data []byte) {
		t.Helper()
		if err := os.WriteFile(f.key, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name   string
		file   []byte // written first, when not nil
		after  time.Duration
		key    ed25519.PrivateKey
		status int
	}{
		{name: "the old key", key: f.priv, status: 200},
		{name: "the new key, not published", key: next, status: 401},
		{name: "both published, within a second of the last read", file: append(slices.Clip(f.pub), nextPEM...), after: 500 * time.Millisecond, key: next, status: 401},
		{name: "both published, read again", after: 500 * time.Millisecond, key: next, status: 200},
		{name: "both published, the old key", key: f.priv, status: 200},
		{name: "the old key dropped", file: nextPEM, after: time.Second, key: f.priv, status: 401},
		{name: "the old key dropped, the new key", key: next, status: 200},
		{name: "a bad file keeps the keys last read", file: []byte("not a key"), after: time.Second, key: next, status: 200},
		{name: "a missing file keeps them too", file: []byte{}, after: time.Second, key: next, status: 200},
	}
	for _, s := range steps {
		if s.file != nil {
			if len(s.file) == 0 {
				if err := os.Remove(f.key); err != nil {
					t.Fatal(err)
				}
			} else {
				write(s.file)
			}
		}
		clock.advance(s.after)
		status, m := assignWith(s.key)
		if status != s.status {
			t.Fatalf("%s: %d %v, want %d", s.name, status, m, s.status)
		}
		if status == 401 && m["reason"] != assign.ReasonBadToken {
			t.Errorf("%s: reason %v, want bad_token", s.name, m["reason"])
		}
	}
}

// TestKeepKeys: with KeepKeys running, the keys follow the file with no
// assign asking (a key added, then the old one dropped), each within
// keyRecheck/2; it stops with its context.
func TestKeepKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, pem := newKey(t)
		_, nextPEM := newKey(t)
		path := filepath.Join(t.TempDir(), "ed25519.pub")
		write := func(data []byte) {
			t.Helper()
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write(pem)
		cfg := DefaultConfig()
		cfg.AssignKey = path
		s := NewServer(cfg, slog.New(slog.DiscardHandler))
		if _, err := s.publicKeys(s.now()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { s.KeepKeys(ctx); close(done) }()
		keys := func() int {
			s.keyMu.Lock()
			defer s.keyMu.Unlock()
			return len(s.keys)
		}
		for _, step := range []struct {
			name string
			file []byte
			want int
		}{
			{"a key added", append(slices.Clip(pem), nextPEM...), 2},
			{"the old key dropped", nextPEM, 1},
		} {
			write(step.file)
			time.Sleep(keyRecheck / 2) // sleep: behaviour (fake clock: half a recheck)
			synctest.Wait()
			if n := keys(); n != step.want {
				t.Errorf("%s: %d keys %s after the file changed, want %d", step.name, n, keyRecheck/2, step.want)
			}
		}
		s.keyMu.Lock()
		last := s.keys[0]
		s.keyMu.Unlock()
		if want, err := assign.ParsePublicKeys(nextPEM); err != nil || !last.Equal(want[0]) {
			t.Errorf("the key kept is not the new one (%v)", err)
		}
		cancel()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Error("KeepKeys still runs after its context ended")
		}
	})
}

// TestKeyReadOutOfOrder: KeepKeys reads the file outside keyMu, so its
// read can land after a later one; the older copy must not bring back a
// key the later read saw dropped, and a later read that failed must not
// hide what an older one found.
func TestKeyReadOutOfOrder(t *testing.T) {
	_, pem := newKey(t)
	_, nextPEM := newKey(t)
	both := append(slices.Clip(pem), nextPEM...)
	t0 := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type read struct {
		name  string
		began time.Time
		file  []byte // nil: the read failed
		want  int
	}
	for _, tc := range []struct {
		name  string
		reads []read
	}{
		{"an older read lands late", []read{
			{"both keys", at(0), both, 2},
			{"the old key dropped", at(2), nextPEM, 1},
			{"an older read of both, late", at(1), both, 1},
			{"a newer read of both", at(3), both, 2},
		}},
		{"a later failed read hides nothing", []read{
			{"one key", at(0), pem, 1},
			{"a failed read", at(2), nil, 1},
			{"an older read that found a key added", at(1), both, 2},
		}},
		{"the first load takes any read", []read{
			{"a failed read first", at(5), nil, 0},
			{"an older read that found the file", at(1), pem, 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServer(DefaultConfig(), slog.New(slog.DiscardHandler))
			s.keyMu.Lock()
			defer s.keyMu.Unlock()
			for _, r := range tc.reads {
				var err error
				if r.file == nil {
					err = os.ErrNotExist
				}
				s.applyKeysLocked(r.began, r.file, err)
				if len(s.keys) != r.want {
					t.Errorf("%s: %d keys kept, want %d", r.name, len(s.keys), r.want)
				}
			}
		})
	}
}

// TestAssignReadTimedUnderLock: an assign that finds its keys stale reads
// the file under keyMu and times the read then, not when it asked: a
// KeepKeys read that began while it waited for the lock (and saw a key
// the file has dropped since) lands after it and is dropped.
func TestAssignReadTimedUnderLock(t *testing.T) {
	_, pem := newKey(t)
	_, nextPEM := newKey(t)
	path := filepath.Join(t.TempDir(), "ed25519.pub")
	if err := os.WriteFile(path, append(slices.Clip(pem), nextPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.AssignKey = path
	s := NewServer(cfg, slog.New(slog.DiscardHandler))
	t0 := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	clock := t0
	s.now = func() time.Time { return clock }
	if keys, err := s.publicKeys(s.now()); err != nil || len(keys) != 2 {
		t.Fatalf("first load: %d keys, %v", len(keys), err)
	}
	asked := t0.Add(2 * keyRecheck) // the assign's own time, the keys stale by then
	kept := t0.Add(2*keyRecheck + time.Millisecond)
	if err := os.WriteFile(path, nextPEM, 0o644); err != nil { // the old key dropped
		t.Fatal(err)
	}
	clock = kept.Add(time.Millisecond) // the assign holds the lock now
	if keys, err := s.publicKeys(asked); err != nil || len(keys) != 1 {
		t.Fatalf("the assign's read: %d keys, %v; want 1", len(keys), err)
	}
	s.keyMu.Lock()
	s.applyKeysLocked(kept, append(slices.Clip(pem), nextPEM...), nil) // KeepKeys' copy, read before the drop
	n := len(s.keys)
	s.keyMu.Unlock()
	if n != 1 {
		t.Errorf("a KeepKeys read that began before the assign's brought back the dropped key: %d keys", n)
	}
}

// TestAssignIDsBounded: the instance remembers at most so many ids, each
// until its token expires; full, it refuses new tokens (503, retry)
// rather than forget an id that could be replayed.
func TestAssignIDsBounded(t *testing.T) {
	clock := newFakeClock()
	f := newFixtureWith(t, true, func(s *Server) { s.now = clock.now; s.used = assign.NewUsed(2) })
	first := f.body(t, echoRequest("default/echo"))
	steps := []struct {
		name   string
		body   func() string
		after  time.Duration
		status int
		reason string
	}{
		{name: "first", body: func() string { return first }, status: 200},
		{name: "second", body: func() string { return f.body(t, echoRequest("default/echo")) }, status: 200},
		{name: "full", body: func() string { return f.body(t, echoRequest("default/echo")) }, status: 503, reason: assign.ReasonTooMany},
		{name: "replay while full", body: func() string { return first }, status: 401, reason: assign.ReasonReplayed},
		{name: "the first two expired: forgotten", after: time.Minute, body: func() string { return f.body(t, echoRequest("default/echo")) }, status: 200},
		{name: "the first replayed after its expiry", body: func() string { return first }, status: 401, reason: assign.ReasonExpired},
	}
	for _, s := range steps {
		clock.advance(s.after)
		status, m := f.assign(t, s.body())
		if status != s.status || s.reason != "" && m["reason"] != s.reason {
			t.Fatalf("%s: %d %v, want %d %s", s.name, status, m, s.status, s.reason)
		}
	}
	f.srv.mu.Lock()
	defer f.srv.mu.Unlock()
	if n := f.srv.used.Len(); n != 1 {
		t.Errorf("%d ids held, want 1 (the expired ones pruned)", n)
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
	if err := Run(t.Context(), []string{"--help"}, flagenv.Map(nil), &out); err != nil {
		t.Fatal(err)
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
	go func() { done <- serve(ctx, ln, h, 5*time.Second, slog.New(slog.DiscardHandler)) }()

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
// requests a router says come from one of them (X-Skipper-Caller); a
// repeat assign hands over new callers; an instance of a function with
// none serves anyone.
func TestCallersChecked(t *testing.T) {
	f := newFixture(t, true)
	assignWith := func(c *assign.Callers) {
		t.Helper()
		if status, m := f.assign(t, f.body(t, assign.Request{Function: "default/private", Callers: c})); status != http.StatusOK {
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
	if status, m := f.assign(t, f.body(t, echoRequest("default/echo"))); status != http.StatusOK {
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

// TestWarm: the warm-up runs every handler it means to (a broken step is
// an error), and leaves the server as it was: unassigned, its key loaded,
// ready for its one claim.
func TestWarm(t *testing.T) {
	f := newFixture(t, true)
	if err := f.srv.Warm(); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	if f.srv.assignment() != nil {
		t.Fatal("Warm assigned the server itself")
	}
	if f.srv.keys == nil {
		t.Error("Warm did not load the assign key")
	}
	if n := f.srv.used.Len(); n != 0 {
		t.Errorf("Warm left %d token ids in the server's memory", n)
	}
	if code, m := f.assign(t, f.body(t, echoRequest("default/echo"))); code != http.StatusOK {
		t.Fatalf("assign after Warm: %d %v", code, m)
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
