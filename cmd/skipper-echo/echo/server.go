package echo

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/controller/instance"
)

// Server is the echo runtime's HTTP handler: the instance contract, served
// by its instance.Holder, and the echo. Its zero value is not usable;
// build it with NewServer.
type Server struct {
	cfg    Config
	holder *instance.Holder
	mux    *http.ServeMux

	mu sync.Mutex
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
	return newServer(cfg, instance.New(holderConfig(cfg), log))
}

// holderConfig is the part of cfg the instance contract takes.
func holderConfig(cfg Config) instance.Config {
	return cfg.Holder(nil)
}

// newServer is NewServer serving the contract from holder.
func newServer(cfg Config, holder *instance.Holder) *Server {
	s := &Server{cfg: cfg, holder: holder, mux: http.NewServeMux(), seen: map[string]uint64{}}
	holder.Register(s.mux)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	s.mux.HandleFunc("/", s.handleEcho)
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

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
		instance.WriteError(w, http.StatusBadRequest, "bad_"+query, fmt.Sprintf("%s %q: want a non-negative duration such as 250ms", query, v))
		return 0, false
	}
	return min(d, s.cfg.MaxSleep), true
}

func (s *Server) handleEcho(w http.ResponseWriter, r *http.Request) {
	seen := s.see(r.URL.Path)
	if !s.holder.CallerAllowed(r.Header.Get(assign.HeaderCaller)) {
		// The function lists its callers, and no router said this is one:
		// a call that went around the routers, or one they let through by
		// mistake. Refused, the instance is assigned, and its function
		// never changes.
		a, _ := s.holder.Assignment()
		if v := r.Header.Get(assign.HeaderCaller); v != "" {
			instance.WriteError(w, http.StatusForbidden, "caller_denied", fmt.Sprintf("function %s does not allow ServiceAccount %s", a.Function, v))
		} else {
			instance.WriteError(w, http.StatusForbidden, "caller_unknown", fmt.Sprintf("function %s allows only the callers it lists, and the request does not say who calls (%s, set by Skipper's routers)", a.Function, assign.HeaderCaller))
		}
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			instance.WriteError(w, http.StatusRequestEntityTooLarge, "body_too_large", err.Error())
			return
		}
		instance.WriteError(w, http.StatusBadRequest, "read_body", err.Error())
		return
	}

	status := http.StatusOK
	if v := control(r, "status", "X-Echo-Status"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 200 || n > 599 {
			instance.WriteError(w, http.StatusBadRequest, "bad_status", fmt.Sprintf("status %q: want an integer in [200, 599]", v))
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
	if a, ok := s.holder.Assignment(); ok {
		resp.Assigned = true
		resp.Function = a.Function
		resp.Config = a.Request.Config
	}
	if !cut && stall == 0 {
		instance.WriteJSON(w, status, resp)
		return
	}
	// A response that breaks, or stalls, after its headers and half its
	// body: what a proxy must survive without leaking what it holds.
	b, err := json.Marshal(resp)
	if err != nil {
		instance.WriteError(w, http.StatusInternalServerError, "encode", err.Error())
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
