package echo

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/internal/tick"
)

// assignment is what the controller handed this instance.
type assignment struct {
	Function string
	Request  assign.Request
	At       time.Time
}

// keyRecheck is how old the keys an assign verifies with may be: a
// rotated key (added, or dropped) is seen within a second of the kubelet
// writing it, with no restart. KeepKeys reads the file twice as often, so
// an assign reads it only before the file first loads or when KeepKeys
// is not running (or falls behind). KeepKeys reads the file outside
// keyMu, so an assign never waits for its read.
const keyRecheck = time.Second

// Server is the echo runtime's HTTP handler. Its zero value is not usable;
// build it with NewServer.
type Server struct {
	cfg Config
	log *slog.Logger
	// now is time.Now outside tests.
	now func() time.Time
	mux *http.ServeMux

	keyMu       sync.Mutex
	keys        []ed25519.PublicKey // nil until the key file loads
	keyRaw      []byte              // the file as keys were parsed from it
	keyReadAt   time.Time           // when the latest read began, good or bad: how old the keys are
	keyLoadedAt time.Time           // when the read the keys were last taken (or confirmed) from began
	keyErr      string              // the last bad read's error, logged once

	mu       sync.Mutex
	assigned *assignment
	used     *assign.Used // ids of the tokens accepted
	// seen counts the requests read per path, for at most maxPaths paths:
	// a test tells from it whether a request reached the instance by any
	// way, even one no caller was answered for (issue 30's smuggled one).
	seen map[string]uint64
}

// maxPaths bounds Server.seen: paths past the first maxPaths are not
// counted (Response.Seen 0), so that a caller cannot grow it without end.
const maxPaths = 1024

// see counts a request for path and returns how many this instance has
// read (0: not counted).
func (s *Server) see(path string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.seen[path]
	if !ok && len(s.seen) >= maxPaths {
		return 0
	}
	s.seen[path] = n + 1
	return n + 1
}

// NewServer returns the handler of every endpoint of the runtime.
func NewServer(cfg Config, log *slog.Logger) *Server {
	s := &Server{cfg: cfg, log: log, now: time.Now, mux: http.NewServeMux(), used: assign.NewUsed(0), seen: map[string]uint64{}}
	s.mux.HandleFunc("POST "+assign.Path, s.handleAssign)
	s.mux.HandleFunc("GET "+assign.Path, s.handleAssignment)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	s.mux.HandleFunc("/", s.handleEcho)
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// publicKeys returns the keys that verify assign tokens: every PEM block
// of the key file (two while a key rotates). The file is read again when
// the last read is keyRecheck old; when it is missing or bad, the keys
// last read keep verifying, and the error is logged once. Before the
// file first loads, its error is returned.
func (s *Server) publicKeys(now time.Time) ([]ed25519.PublicKey, error) {
	s.keyMu.Lock()
	defer s.keyMu.Unlock()
	if s.keys != nil && now.Sub(s.keyReadAt) < keyRecheck {
		return s.keys, nil
	}
	return s.loadKeysLocked()
}

// KeepKeys reads the key file every keyRecheck/2 until ctx ends, so that
// an assign verifies with keys at most that old and reads no file on its
// way: the read (open, stat, read, close) showed as about 0.1 ms of a
// cold call's instance time in perf (docs/benchmarks.md).
func (s *Server) KeepKeys(ctx context.Context) {
	tick.After(ctx, keyRecheck/2, func(time.Time) {
		began := s.now()
		data, err := os.ReadFile(s.cfg.AssignKey)
		s.keyMu.Lock()
		_, _ = s.applyKeysLocked(began, data, err)
		s.keyMu.Unlock()
	})
}

// loadKeysLocked reads the key file (publicKeys says what is kept when
// it is missing or bad); keyMu is held. The read is timed here, under the
// lock, not when its caller asked: a KeepKeys read that began while the
// caller waited for the lock is older than this one.
func (s *Server) loadKeysLocked() ([]ed25519.PublicKey, error) {
	began := s.now()
	data, err := os.ReadFile(s.cfg.AssignKey)
	return s.applyKeysLocked(began, data, err)
}

// applyKeysLocked takes the key file as a read that began at began found
// it (data, or err); keyMu is held. KeepKeys reads outside the lock, so
// its read may land after a later one: a read that began before the one
// the keys were taken from is dropped, so an older copy cannot bring back
// a key a later read saw dropped (a later read that failed drops nothing:
// it told nothing of the keys). This orders reads by s.now, which is
// monotonic outside tests.
func (s *Server) applyKeysLocked(began time.Time, data []byte, err error) ([]ed25519.PublicKey, error) {
	if s.keys != nil && began.Before(s.keyLoadedAt) {
		return s.keys, nil
	}
	if began.After(s.keyReadAt) {
		s.keyReadAt = began
	}
	if err == nil && s.keys != nil && bytes.Equal(data, s.keyRaw) {
		s.keyLoadedAt = began
		return s.keys, nil
	}
	var keys []ed25519.PublicKey
	if err == nil {
		keys, err = assign.ParsePublicKeys(data)
	}
	if err != nil {
		err = fmt.Errorf("assign key %s: %w", s.cfg.AssignKey, err)
		if s.keys == nil {
			return nil, err
		}
		if err.Error() != s.keyErr {
			s.keyErr = err.Error()
			s.log.Warn("assign key file unreadable, keeping the keys last read", "path", s.cfg.AssignKey, "keys", len(s.keys), "err", err)
		}
		return s.keys, nil
	}
	if s.keys != nil {
		s.log.Info("assign keys changed", "path", s.cfg.AssignKey, "keys", len(keys))
	}
	s.keys, s.keyRaw, s.keyErr, s.keyLoadedAt = keys, data, "", began
	return keys, nil
}

type assignResponse struct {
	Ready    bool   `json:"ready"`
	Function string `json:"function"`
	Pod      string `json:"pod,omitempty"`
	PodUID   string `json:"podUID"`
}

func (s *Server) handleAssign(w http.ResponseWriter, r *http.Request) {
	var req assign.Request
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "malformed_body", fmt.Sprintf("decode assign request: %v", err))
		return
	}
	if req.Token == "" || req.Function == "" {
		writeError(w, http.StatusBadRequest, "malformed_body", "assign request needs token and function")
		return
	}
	now := s.now()
	keys, err := s.publicKeys(now)
	if err != nil {
		s.log.Warn("assign key not loaded", "path", s.cfg.AssignKey, "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "key_unavailable", err.Error())
		return
	}
	claims, err := assign.VerifyRequest(keys, req, s.cfg.PodUID, now)
	if err != nil {
		s.refuse(w, req, err)
		return
	}

	s.mu.Lock()
	prev := s.assigned
	if prev != nil && (prev.Function != req.Function || prev.Request.Oneshot && prev.Request.Claim != req.Claim) {
		s.mu.Unlock()
		writeJSON(w, http.StatusConflict, assign.Conflict{Reason: assign.ReasonAlreadyAssigned, Function: prev.Function,
			Error: fmt.Sprintf("instance is assigned to %s", prev.Function)})
		return
	}
	// A token assigns once: a replayed one changes nothing. A fresh token
	// for the function held is accepted: the controller retries when it
	// lost the answer, and assigns again to hand over new callers; for a
	// oneshot function only from the claim that won (above).
	if err := s.used.Use(claims, now); err != nil {
		s.mu.Unlock()
		s.refuse(w, req, err)
		return
	}
	s.assigned = &assignment{Function: req.Function, Request: req, At: now}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, assignResponse{Ready: true, Function: req.Function, Pod: s.cfg.PodName, PodUID: s.cfg.PodUID})
	if prev == nil {
		// After the answer is on its way: the claim it decides waits for
		// no log write (and the process reading the log is not woken
		// first).
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		s.log.Info("assigned", "function", req.Function, "oneshot", req.Oneshot)
	}
}

// handleAssignment answers what the instance holds (assign.Assignment),
// 404 unassigned when nothing, 404 other_pod when asked as another pod.
func (s *Server) handleAssignment(w http.ResponseWriter, r *http.Request) {
	if uid := r.URL.Query().Get("pod"); uid != "" && uid != s.cfg.PodUID {
		writeError(w, http.StatusNotFound, assign.ReasonOtherPod, fmt.Sprintf("this instance is pod %s, not %s", s.cfg.PodUID, uid))
		return
	}
	a := s.assignment()
	if a == nil {
		writeError(w, http.StatusNotFound, assign.ReasonUnassigned, "the instance holds no function")
		return
	}
	writeJSON(w, http.StatusOK, assign.Assignment{Function: a.Function})
}

// refuse answers an assign whose token the instance does not accept (err
// from assign.VerifyRequest or assign.Used.Use): 401 with
// assign.Reason(err), or 503 when the instance holds too many ids to
// take another now.
func (s *Server) refuse(w http.ResponseWriter, req assign.Request, err error) {
	reason := assign.Reason(err)
	s.log.Warn("assign refused", "function", req.Function, "reason", reason, "err", err)
	status := http.StatusUnauthorized
	if errors.Is(err, assign.ErrTooMany) {
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	}
	writeError(w, status, reason, err.Error())
}

func (s *Server) assignment() *assignment {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.assigned
}

// Pod names the pod that answered.
type Pod struct {
	Name string `json:"name,omitempty"`
	UID  string `json:"uid"`
}

// Response is the JSON body of an echo.
type Response struct {
	Method   string              `json:"method"`
	Path     string              `json:"path"`
	Query    map[string][]string `json:"query"`
	Headers  map[string][]string `json:"headers"`
	Host     string              `json:"host"`
	Body     string              `json:"body"`
	Pod      Pod                 `json:"pod"`
	Assigned bool                `json:"assigned"`
	Function string              `json:"function,omitempty"`
	Config   map[string]string   `json:"Config,omitempty"`
	// Seen is how many requests for Path this instance has read, this one
	// included (0: past the first 1024 paths, not counted).
	Seen uint64 `json:"seen"`
}

// control reads a behaviour knob from the query, then from the header.
func control(r *http.Request, query, header string) string {
	if v := r.URL.Query().Get(query); v != "" {
		return v
	}
	return r.Header.Get(header)
}

// durationControl reads the duration knob query (or header), at most
// MaxSleep; zero when it is not set. A malformed one is answered with 400
// bad_<query>, and ok is false.
func (s *Server) durationControl(w http.ResponseWriter, r *http.Request, query, header string) (d time.Duration, ok bool) {
	v := control(r, query, header)
	if v == "" {
		return 0, true
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		writeError(w, http.StatusBadRequest, "bad_"+query, fmt.Sprintf("%s %q: want a non-negative duration such as 250ms", query, v))
		return 0, false
	}
	return min(d, s.cfg.MaxSleep), true
}

func (s *Server) handleEcho(w http.ResponseWriter, r *http.Request) {
	seen := s.see(r.URL.Path)
	if a := s.assignment(); a != nil && !a.Request.Callers.Allows(r.Header.Get(assign.HeaderCaller)) {
		// The function lists its callers, and no router said this is one:
		// a call that went around the routers, or one they let through by
		// mistake.
		if v := r.Header.Get(assign.HeaderCaller); v != "" {
			writeError(w, http.StatusForbidden, "caller_denied", fmt.Sprintf("function %s does not allow ServiceAccount %s", a.Function, v))
		} else {
			writeError(w, http.StatusForbidden, "caller_unknown", fmt.Sprintf("function %s allows only the callers it lists, and the request does not say who calls (%s, set by Skipper's routers)", a.Function, assign.HeaderCaller))
		}
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", err.Error())
			return
		}
		writeError(w, http.StatusBadRequest, "read_body", err.Error())
		return
	}

	status := http.StatusOK
	if v := control(r, "status", "X-Echo-Status"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 200 || n > 599 {
			writeError(w, http.StatusBadRequest, "bad_status", fmt.Sprintf("status %q: want an integer in [200, 599]", v))
			return
		}
		status = n
	}
	sleep, ok := s.durationControl(w, r, "sleep", "X-Echo-Sleep")
	if !ok {
		return
	}
	if sleep > 0 {
		t := time.NewTimer(sleep)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return // the caller is gone; nobody reads an answer
		}
	}
	if on(control(r, "fail", "X-Echo-Fail")) {
		// Drops the connection (HTTP/1) or resets the stream (HTTP/2) without
		// an answer; net/http does not log this sentinel.
		panic(http.ErrAbortHandler)
	}
	cut := on(control(r, "cut", "X-Echo-Cut"))
	stall, ok := s.durationControl(w, r, "stall", "X-Echo-Stall")
	if !ok {
		return
	}

	resp := Response{
		Method:  r.Method,
		Path:    r.URL.Path,
		Query:   r.URL.Query(),
		Headers: r.Header,
		Host:    r.Host,
		Body:    string(body),
		Pod:     Pod{Name: s.cfg.PodName, UID: s.cfg.PodUID},
		Seen:    seen,
	}
	if a := s.assignment(); a != nil {
		resp.Assigned = true
		resp.Function = a.Function
		resp.Config = a.Request.Config
	}
	if !cut && stall == 0 {
		writeJSON(w, status, resp)
		return
	}
	// A response that breaks, or stalls, after its headers and half its
	// body: what a proxy must survive without leaking what it holds.
	b, err := json.Marshal(resp)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encode", err.Error())
		return
	}
	// No Content-Length: the body is chunked, as a stream is, so proxies
	// pass each part on as it comes.
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b[:len(b)/2])
	_ = http.NewResponseController(w).Flush()
	if cut {
		panic(http.ErrAbortHandler)
	}
	t := time.NewTimer(stall)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return
	}
	_, _ = w.Write(b[len(b)/2:])
}

// on reads a boolean knob: set and not "0" or "false".
func on(v string) bool { return v != "" && v != "0" && v != "false" }

type errorBody struct {
	Error  string `json:"error"`
	Reason string `json:"reason"`
}

func writeError(w http.ResponseWriter, status int, reason, msg string) {
	writeJSON(w, status, errorBody{Error: msg, Reason: reason})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}
