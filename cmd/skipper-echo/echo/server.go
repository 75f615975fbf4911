package echo

import (
	"bytes"
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
)

// assignment is what the controller handed this instance.
type assignment struct {
	Function string
	Request  assign.Request
	At       time.Time
}

// Server is the echo runtime's HTTP handler. Its zero value is not usable;
// build it with NewServer.
type Server struct {
	cfg Config
	log *slog.Logger
	// now is time.Now outside tests.
	now func() time.Time
	mux *http.ServeMux

	mu       sync.Mutex
	key      ed25519.PublicKey // nil until the key file loads
	assigned *assignment
}

// NewServer returns the handler of every endpoint of the runtime.
func NewServer(cfg Config, log *slog.Logger) *Server {
	s := &Server{cfg: cfg, log: log, now: time.Now, mux: http.NewServeMux()}
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

// publicKey returns the assign key, reading the file until it loads once.
func (s *Server) publicKey() (ed25519.PublicKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.key != nil {
		return s.key, nil
	}
	data, err := os.ReadFile(s.cfg.AssignKey)
	if err != nil {
		return nil, fmt.Errorf("read assign key: %w", err)
	}
	k, err := assign.ParsePublicKey(data)
	if err != nil {
		return nil, fmt.Errorf("assign key %s: %w", s.cfg.AssignKey, err)
	}
	s.key = k
	return k, nil
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
	key, err := s.publicKey()
	if err != nil {
		s.log.Warn("assign key not loaded", "path", s.cfg.AssignKey, "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "key_unavailable", err.Error())
		return
	}
	claims, err := assign.Verify(key, req.Token, s.cfg.PodUID, s.now())
	if err != nil {
		s.log.Warn("assign rejected", "function", req.Function, "err", err)
		writeError(w, http.StatusUnauthorized, "bad_token", err.Error())
		return
	}
	if claims.Function != req.Function {
		writeError(w, http.StatusUnauthorized, "bad_token",
			fmt.Sprintf("token is for function %q, body names %q", claims.Function, req.Function))
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
	// A repeated assign for the same function is accepted: the controller
	// retries when it lost the answer, and may hand over a newer config;
	// for a oneshot function only from the claim that won (above).
	s.assigned = &assignment{Function: req.Function, Request: req, At: s.now()}
	s.mu.Unlock()
	if prev == nil {
		s.log.Info("assigned", "function", req.Function, "oneshot", req.Oneshot)
	}
	writeJSON(w, http.StatusOK, assignResponse{Ready: true, Function: req.Function, Pod: s.cfg.PodName, PodUID: s.cfg.PodUID})
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
}

// control reads a behaviour knob from the query, then from the header.
func control(r *http.Request, query, header string) string {
	if v := r.URL.Query().Get(query); v != "" {
		return v
	}
	return r.Header.Get(header)
}

func (s *Server) handleEcho(w http.ResponseWriter, r *http.Request) {
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
	if v := control(r, "sleep", "X-Echo-Sleep"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			writeError(w, http.StatusBadRequest, "bad_sleep", fmt.Sprintf("sleep %q: want a non-negative duration such as 250ms", v))
			return
		}
		d = min(d, s.cfg.MaxSleep)
		t := time.NewTimer(d)
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
	var stall time.Duration
	if v := control(r, "stall", "X-Echo-Stall"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			writeError(w, http.StatusBadRequest, "bad_stall", fmt.Sprintf("stall %q: want a non-negative duration such as 250ms", v))
			return
		}
		stall = min(d, s.cfg.MaxSleep)
	}

	resp := Response{
		Method:  r.Method,
		Path:    r.URL.Path,
		Query:   r.URL.Query(),
		Headers: r.Header,
		Host:    r.Host,
		Body:    string(body),
		Pod:     Pod{Name: s.cfg.PodName, UID: s.cfg.PodUID},
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
