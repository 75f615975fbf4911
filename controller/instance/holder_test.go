package instance

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/controller/instance/instancetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testUID = "0f1e2d3c-uid"

type fixture struct {
	priv ed25519.PrivateKey
	pub  []byte
	key  string // path of the public key file
	now  func() time.Time
	h    *Holder
	ts   *httptest.Server
}

func newFixture(t *testing.T, writeKey bool) *fixture {
	t.Helper()
	return newFixtureWith(t, writeKey, nil)
}

// newFixtureWith is newFixture with setup applied to the holder before it
// serves (its clock, its id memory, its hook).
func newFixtureWith(t *testing.T, writeKey bool, setup func(*Holder)) *fixture {
	t.Helper()
	k := instancetest.NewKey(t)
	f := &fixture{priv: k.Priv, pub: k.PEM, key: k.Path}
	if writeKey {
		k.Write(t)
	}
	f.h = New(Config{PodUID: testUID, PodName: "echo-pool-abc", KeyFile: f.key}, slog.New(slog.DiscardHandler))
	if setup != nil {
		setup(f.h)
	}
	f.now = f.h.now
	mux := http.NewServeMux()
	f.h.Register(mux)
	f.ts = httptest.NewServer(mux)
	t.Cleanup(f.ts.Close)
	return f
}

func newKey(t *testing.T) (ed25519.PrivateKey, []byte) {
	t.Helper()
	k := instancetest.NewKey(t)
	return k.Priv, k.PEM
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
	tok, err := assign.Sign(assign.FormatV1, f.priv, assign.Claims{Audience: aud, Function: fn, IssuedAt: now.Unix(), Expiry: now.Add(exp).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// signed is r with a token for aud signed by key, valid for exp.
func (f *fixture) signed(t *testing.T, key ed25519.PrivateKey, aud string, r assign.Request, exp time.Duration) assign.Request {
	t.Helper()
	return (&instancetest.Key{Priv: key}).Sign(t, aud, r, f.now(), exp)
}

// body is the JSON of r signed by the fixture's key for this pod, valid a
// minute.
func (f *fixture) body(t *testing.T, r assign.Request) string {
	t.Helper()
	return instancetest.Encode(t, f.signed(t, f.priv, testUID, r, time.Minute))
}

// echoRequest is the request TestAssign assigns.
func echoRequest(fn string) assign.Request {
	return assign.Request{Function: fn, Config: map[string]string{"k": "v"}}
}

func (f *fixture) assign(t *testing.T, body string) (int, map[string]any) {
	t.Helper()
	return instancetest.Assign(t, f.ts.Client(), f.ts.URL, body)
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
			return instancetest.Encode(t, r)
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
			return instancetest.Encode(t, f.signed(t, f.priv, "someone-else", echoRequest("default/echo"), time.Minute))
		}, 401, "bad_token"},
		{"expired", func() string {
			return instancetest.Encode(t, f.signed(t, f.priv, testUID, echoRequest("default/echo"), -time.Second))
		}, 401, "expired"},
		{"another key", func() string {
			other, _ := newKey(t)
			return instancetest.Encode(t, f.signed(t, other, testUID, echoRequest("default/echo"), time.Minute))
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

// config is the config the holder holds.
func (f *fixture) config(t *testing.T) map[string]string {
	t.Helper()
	a, _ := f.h.Assignment()
	return a.Request.Config
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
	if status, m := f.assign(t, instancetest.Encode(t, tampered)); status != http.StatusUnauthorized || m["reason"] != assign.ReasonBadToken ||
		!strings.Contains(m["error"].(string), "request does not match its token") {
		t.Fatalf("a changed body: %d %v, want 401 bad_token", status, m)
	}
	if diff := cmp.Diff(map[string]string{"v": "2"}, f.config(t)); diff != "" {
		t.Errorf("config after the refusals (-want +got):\n%s", diff)
	}
}

// TestAssignIDsBounded: the instance remembers at most so many ids, each
// until its token expires; full, it refuses new tokens (503, retry)
// rather than forget an id that could be replayed.
func TestAssignIDsBounded(t *testing.T) {
	clock := newFakeClock()
	f := newFixtureWith(t, true, func(h *Holder) { h.now = clock.now; h.used = assign.NewUsed(2) })
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
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	if n := f.h.used.Len(); n != 1 {
		t.Errorf("%d ids held, want 1 (the expired ones pruned)", n)
	}
}

// TestAssignmentAnswered: GET on the assign endpoint says what the
// instance holds, read-only: nothing (404 unassigned), then the function
// assigned; asked as another pod, 404 other_pod. Every answer lists the
// token formats the instance verifies.
func TestAssignmentAnswered(t *testing.T) {
	f := newFixture(t, true)
	get := func(query string) (int, map[string]any) {
		t.Helper()
		resp, err := f.ts.Client().Get(f.ts.URL + assign.Path + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if got := resp.Header.Get(assign.HeaderTokenFormats); got != "jws, v1" {
			t.Errorf("GET %s: %s %q, want \"jws, v1\"", query, assign.HeaderTokenFormats, got)
		}
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

// TestCallerAllowed: an unassigned instance serves anyone; one assigned
// with callers serves only the requests a router says come from one of
// them (X-Skipper-Caller); a repeat assign hands over new callers; an
// instance of a function with none serves anyone.
func TestCallerAllowed(t *testing.T) {
	f := newFixture(t, true)
	assignWith := func(c *assign.Callers) {
		t.Helper()
		if status, m := f.assign(t, f.body(t, assign.Request{Function: "default/private", Callers: c})); status != http.StatusOK {
			t.Fatalf("assign: %d %v", status, m)
		}
	}
	check := func(when string, cases map[string]bool) {
		t.Helper()
		for caller, want := range cases {
			if got := f.h.CallerAllowed(caller); got != want {
				t.Errorf("%s: caller %q allowed = %v, want %v", when, caller, got, want)
			}
		}
	}
	check("unassigned", map[string]bool{"": true, "team-z/x": true})
	assignWith(&assign.Callers{Namespaces: []string{"team-a"}, ServiceAccounts: []string{"team-b/web"}})
	check("callers listed", map[string]bool{"team-a/default": true, "team-b/web": true, "team-b/batch": false, "team-a": false, "": false})
	assignWith(&assign.Callers{Namespaces: []string{"team-c"}}) // the Function's callers changed
	check("callers changed", map[string]bool{"team-a/default": false, "team-c/x": true})
	assignWith(nil) // the Function lists no callers any more
	check("no callers listed", map[string]bool{"": true})
}

// TestOnAssign: the hook is handed the assignment once per accepted
// assign that changed it, before the assign is answered; refusals,
// conflicts and repeats of the same request (a fresh token and claim)
// hand nothing on.
func TestOnAssign(t *testing.T) {
	var (
		mu     sync.Mutex
		handed []Assignment
	)
	f := newFixtureWith(t, true, func(h *Holder) {
		h.cfg.OnAssign = func(a Assignment) error {
			mu.Lock()
			defer mu.Unlock()
			handed = append(handed, a)
			return nil
		}
	})
	private := &assign.Callers{Namespaces: []string{"team-a"}}
	first := assign.Request{Function: "default/echo", Config: map[string]string{"v": "1"}, Claim: "a"}
	sameOtherClaim := assign.Request{Function: "default/echo", Config: map[string]string{"v": "1"}, Claim: "b"}
	newCallers := assign.Request{Function: "default/echo", Config: map[string]string{"v": "1"}, Callers: private, Claim: "c"}
	newConfig := assign.Request{Function: "default/echo", Config: map[string]string{"v": "2"}, Callers: private, Claim: "c"}
	firstBody := f.body(t, first)
	steps := []struct {
		name   string
		body   string
		status int
		calls  int
		last   assign.Request // the request handed last, its token aside
	}{
		{"refused", assignBody(t, "v1.abc.def", "default/echo"), 401, 0, assign.Request{}},
		{"first", firstBody, 200, 1, first},
		{"replayed", firstBody, 401, 1, first},
		{"the same request, another claim", f.body(t, sameOtherClaim), 200, 1, first},
		{"another function", f.body(t, echoRequest("default/other")), 409, 1, first},
		{"callers changed", f.body(t, newCallers), 200, 2, newCallers},
		{"config changed", f.body(t, newConfig), 200, 3, newConfig},
	}
	for _, s := range steps {
		status, m := f.assign(t, s.body)
		if status != s.status {
			t.Fatalf("%s: %d %v, want %d", s.name, status, m, s.status)
		}
		// The assign was answered: the hook it called has returned.
		mu.Lock()
		calls := slices.Clone(handed)
		mu.Unlock()
		if len(calls) != s.calls {
			t.Fatalf("%s: hook called %d times, want %d", s.name, len(calls), s.calls)
		}
		if len(calls) == 0 {
			continue
		}
		last := calls[len(calls)-1]
		last.Request.Token = ""
		if diff := cmp.Diff(s.last, last.Request); diff != "" || last.Function != s.last.Function {
			t.Errorf("%s: handed %s (-want +got):\n%s", s.name, last.Function, diff)
		}
	}
}

// TestOnAssignRefuses: a hook's error refuses the assign with 503
// handover_failed; the Holder keeps what it held before (nothing, for a
// first assign; the old callers, for a repeat), and the next assign is
// handed on again.
func TestOnAssignRefuses(t *testing.T) {
	refuse := true
	f := newFixtureWith(t, true, func(h *Holder) {
		h.cfg.OnAssign = func(a Assignment) error { // under hookMu: calls never overlap
			if refuse {
				return fmt.Errorf("the application refused %s", a.Function)
			}
			return nil
		}
	})
	first := assign.Request{Function: "default/echo", Claim: "a"}
	if status, m := f.assign(t, f.body(t, first)); status != http.StatusServiceUnavailable || m["reason"] != reasonHandoverFailed {
		t.Fatalf("refused hand-over: %d %v, want 503 %s", status, m, reasonHandoverFailed)
	}
	if _, ok := f.h.Assignment(); ok {
		t.Fatal("the Holder holds an assignment its runtime refused")
	}
	if status, m := f.assign(t, f.body(t, assign.Request{Function: "default/other", Claim: "b"})); status != http.StatusServiceUnavailable {
		t.Fatalf("another function after a refusal: %d %v, want it handed on (and refused) too, not a 409", status, m)
	}
	refuse = false
	if status, m := f.assign(t, f.body(t, first)); status != http.StatusOK {
		t.Fatalf("after the runtime came round: %d %v", status, m)
	}
	refuse = true
	private := assign.Request{Function: "default/echo", Callers: &assign.Callers{Namespaces: []string{"team-a"}}, Claim: "c"}
	if status, _ := f.assign(t, f.body(t, private)); status != http.StatusServiceUnavailable {
		t.Fatalf("a refused repeat: %d, want 503", status)
	}
	if a, ok := f.h.Assignment(); !ok || a.Request.Callers != nil {
		t.Errorf("after a refused repeat the Holder holds %+v, want the first assignment (no callers)", a)
	}
}

// TestOnAssignRefusedWhileAnotherWaits: an assign arriving while a
// hand-over is under way waits for it (no 409 for an assignment the
// runtime may yet refuse); when both are refused the Holder holds nothing
// and takes another function.
func TestOnAssignRefusedWhileAnotherWaits(t *testing.T) {
	entered, release := make(chan struct{}, 2), make(chan struct{})
	f := newFixtureWith(t, true, func(h *Holder) {
		h.cfg.OnAssign = func(a Assignment) error {
			if a.Function == "default/other" {
				return nil
			}
			entered <- struct{}{}
			<-release
			return errors.New("refused")
		}
	})
	statuses := make(chan int, 2)
	for _, claim := range []string{"a", "b"} {
		body := f.body(t, assign.Request{Function: "default/x", Claim: claim})
		go func() {
			status, _ := f.assign(t, body)
			statuses <- status
		}()
	}
	<-entered // one hand-over under way; the other assign waits for it
	if _, ok := f.h.Assignment(); ok {
		t.Error("the Holder holds an assignment its runtime has not taken yet")
	}
	close(release)
	for range 2 {
		if got := <-statuses; got != http.StatusServiceUnavailable {
			t.Errorf("a refused hand-over answered %d, want 503", got)
		}
	}
	if a, ok := f.h.Assignment(); ok {
		t.Fatalf("after two refusals the Holder holds %s", a.Function)
	}
	if status, m := f.assign(t, f.body(t, assign.Request{Function: "default/other", Claim: "c"})); status != http.StatusOK {
		t.Errorf("another function after the refusals: %d %v, want 200", status, m)
	}
}

// TestOnAssignConcurrent: concurrent assigns, each changing the config,
// hand on in order: never the same assignment twice in a row, and last
// what the Holder holds.
func TestOnAssignConcurrent(t *testing.T) {
	var handed []string // under the Holder's hookMu: calls never overlap
	f := newFixtureWith(t, true, func(h *Holder) {
		h.cfg.OnAssign = func(a Assignment) error { handed = append(handed, a.Request.Config["n"]); return nil }
	})
	const n = 8
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = f.body(t, assign.Request{Function: "default/echo", Config: map[string]string{"n": fmt.Sprint(i)}})
	}
	var wg sync.WaitGroup
	for _, b := range bodies {
		wg.Go(func() {
			resp, err := f.ts.Client().Post(f.ts.URL+assign.Path, "application/json", strings.NewReader(b))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("assign: %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	f.h.hookMu.Lock()
	defer f.h.hookMu.Unlock()
	if len(handed) == 0 || len(handed) > n {
		t.Fatalf("hook called %d times for %d assigns", len(handed), n)
	}
	for i := 1; i < len(handed); i++ {
		if handed[i] == handed[i-1] {
			t.Errorf("handed config %s twice in a row: %v", handed[i], handed)
		}
	}
	if held, _ := f.h.Assignment(); handed[len(handed)-1] != held.Request.Config["n"] {
		t.Errorf("handed last %s, holds %s (%v)", handed[len(handed)-1], held.Request.Config["n"], handed)
	}
}

// TestNewWarmUp: the warm-up Holder accepts an assign signed with its own
// key, and not one signed with the key in cfg's key file, which it never
// reads.
func TestNewWarmUp(t *testing.T) {
	f := newFixture(t, true)
	h, priv, err := NewWarmUp(Config{PodUID: "warm-up", KeyFile: f.key})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	for _, tt := range []struct {
		name   string
		key    ed25519.PrivateKey
		status int
	}{
		{"the key file's key", f.priv, http.StatusUnauthorized},
		{"its own key", priv, http.StatusOK},
	} {
		body := instancetest.Encode(t, f.signed(t, tt.key, "warm-up", echoRequest("warm-up/warm-up"), time.Minute))
		resp, err := ts.Client().Post(ts.URL+assign.Path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.status {
			t.Errorf("%s: %d, want %d", tt.name, resp.StatusCode, tt.status)
		}
	}
}
