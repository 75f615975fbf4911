package echo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"time"

	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/controller/instance"
)

// A pool pod is kept warm so that a claim is fast, but a fresh Go process
// pays for much of its code's first run (instance.NewWarmUp says what and
// how much), the echo handler's and the mux's patterns too. Warm runs the
// assign and echo handlers once, on a throwaway server with a throwaway
// key, before the pod is ready, so the first real claim pays none of it;
// then it touches and frees some heap (prefaultHeap).

// Warm exercises the assign, assignment and echo handlers of a throwaway
// Server (its own key, its own state: s is untouched), then loads s's
// assign key file when it is there, so none of it is left to a claim. It
// returns what went wrong; a failed warm-up costs the first claim time,
// nothing else.
func (s *Server) Warm() error {
	cfg := s.cfg
	cfg.PodUID = "warm-up"
	cfg.AssignKey = "" // the throwaway holder has a key of its own: never the real file
	holder, priv, err := instance.NewWarmUp(holderConfig(cfg))
	if err != nil {
		return err
	}
	t := newServer(cfg, holder)

	req := assign.Request{Function: "warm-up/warm-up", Port: 8080, Claim: assign.NewID(),
		Config: map[string]string{"k": "v"}, Callers: &assign.Callers{Namespaces: []string{"warm-up"}}}
	if req.Token, err = assign.SignRequest(assign.FormatJWS, priv, cfg.PodUID, req, time.Now(), time.Minute); err != nil {
		return fmt.Errorf("warm-up token: %w", err)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("warm-up request: %w", err)
	}
	steps := []struct {
		method, target string
		body           []byte
		header         http.Header
		want           int
	}{
		{http.MethodPost, assign.Path, body, http.Header{"Content-Type": {"application/json"}}, http.StatusOK},
		{http.MethodGet, assign.Path + "?pod=warm-up", nil, nil, http.StatusOK},
		{http.MethodGet, "/warm-up?x=1", nil, http.Header{assign.HeaderCaller: {"warm-up/default"}}, http.StatusOK},
		{http.MethodGet, "/warm-up", nil, nil, http.StatusForbidden},
	}
	for _, st := range steps {
		r, err := http.NewRequest(st.method, "http://warm-up"+st.target, bytes.NewReader(st.body))
		if err != nil {
			return fmt.Errorf("warm-up %s %s: %w", st.method, st.target, err)
		}
		for k, v := range st.header {
			r.Header[k] = v
		}
		w := &discard{header: http.Header{}}
		t.ServeHTTP(w, r)
		if w.status != st.want {
			return fmt.Errorf("warm-up %s %s: status %d, want %d: %s", st.method, st.target, w.status, st.want, strings.TrimSpace(w.body.String()))
		}
	}
	// The key file may not be there yet (the kubelet retries a missing
	// ConfigMap volume): then the first assign reads it.
	_ = s.holder.LoadKeys()
	prefaultHeap(prefaultBytes)
	return nil
}

// prefaultBytes is how much heap the warm-up touches and frees: about
// what the first claim (assign and first request) allocates, ten times
// over.
const prefaultBytes = 2 << 20

// prefaultHeap touches n bytes of fresh heap, one write per page, and
// collects. A fresh Go process carves each new span from pages it never
// touched, and the first write to such a page is a page fault: 14–15 µs
// on the VM we measure on (shadow paging); a pool pod's first claim
// allocated its spans that way (15.4 faults per cold call in the
// instance, docs/benchmarks.md). After this, new spans come from pages
// already mapped (10.8 faults per call, measured on pods claimed within a
// minute or so of starting). The runtime's scavenger may hand free pages
// back to the OS after later collections (a forced one runs every two
// minutes), but two pods idle for 16 minutes took 2 minor faults each in
// their cold call against 3–17 for five pods seconds old
// (docs/benchmarks.md).
func prefaultHeap(n int) {
	b := make([]byte, n)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	runtime.KeepAlive(b)
	runtime.GC()
}

// discard is the ResponseWriter of the warm-up: it keeps the status and
// the start of the body, for the error.
type discard struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (d *discard) Header() http.Header { return d.header }

func (d *discard) WriteHeader(status int) {
	if d.status == 0 {
		d.status = status
	}
}

func (d *discard) Write(b []byte) (int, error) {
	d.WriteHeader(http.StatusOK)
	if d.body.Len() < 512 {
		d.body.Write(b[:min(len(b), 512)])
	}
	return len(b), nil
}

var _ io.Writer = (*discard)(nil)
