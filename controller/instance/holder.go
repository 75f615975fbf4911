package instance

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"skipper.dev/skipper/controller/assign"
)

// DefaultMaxBody is Config.MaxBody's default.
const DefaultMaxBody = 1 << 20

// Config is what a Holder needs of its runtime.
type Config struct {
	// PodUID is this pod's UID (downward API metadata.uid): the audience
	// an assign token must name. Required.
	PodUID string
	// PodName is this pod's name, named in the assign's answer; may be
	// empty.
	PodName string
	// KeyFile is the path of the PEM ed25519 public keys that verify
	// assign tokens (ConfigMap skipper-assign-key; several blocks while a
	// key rotates).
	KeyFile string
	// MaxBody is the largest assign body read, in bytes; DefaultMaxBody
	// when ≤ 0.
	MaxBody int64
	// OnAssign, when not nil, is handed what the Holder holds once per
	// accepted assign that changed it: the first, and a repeat whose
	// request differs in anything but its token and claim (new callers,
	// a new config). It runs before the assign is answered, so a
	// controller records the claim only once the runtime has the
	// assignment; it must bound its own work (the controller times out an
	// assign). Assigns with a hook are taken one at a time (decided,
	// handed over, then held), so calls never overlap and the Holder
	// holds only what the runtime took. Nil: nothing is handed on.
	//
	// An error refuses the assign (503 handover_failed): the Holder keeps
	// what it held (nothing, for a claim: the controller then gives the
	// pod up, deleting it so that the pool makes a new one).
	OnAssign func(Assignment) error
}

// Assignment is what the controller handed the instance. Its Request's
// Config and Callers are shared with the Holder: read them, never change
// them.
type Assignment struct {
	// Function is "namespace/name".
	Function string
	// Request is the accepted assign's body.
	Request assign.Request
	// At is when it was accepted.
	At time.Time
}

// Holder serves the instance contract and holds what it was assigned.
// Its zero value is not usable; build it with New.
type Holder struct {
	cfg Config
	log *slog.Logger
	// now is time.Now outside tests.
	now func() time.Time

	keyMu       sync.Mutex
	keys        []ed25519.PublicKey // nil until the key file loads
	keyRaw      []byte              // the file as keys were parsed from it
	keyReadAt   time.Time           // when the latest read began, good or bad: how old the keys are
	keyLoadedAt time.Time           // when the read the keys were last taken (or confirmed) from began
	keyErr      string              // the last bad read's error, logged once

	mu       sync.Mutex
	assigned *Assignment
	used     *assign.Used // ids of the tokens accepted

	// hookMu makes an assign with Config.OnAssign one step: decide, hand
	// over, commit (handleAssign); h.assigned is only ever what the
	// runtime took.
	hookMu sync.Mutex
}

// New returns an unassigned Holder for cfg, logging to log.
func New(cfg Config, log *slog.Logger) *Holder {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	return &Holder{cfg: cfg, log: log, now: time.Now, used: assign.NewUsed(0)}
}

// Register serves the contract on mux: POST and GET on assign.Path.
func (h *Holder) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST "+assign.Path, h.handleAssign)
	mux.HandleFunc("GET "+assign.Path, h.handleAssignment)
}

// Assignment returns what the Holder holds; ok is false while it is
// unassigned.
func (h *Holder) Assignment() (a Assignment, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.assigned == nil {
		return Assignment{}, false
	}
	return *h.assigned, true
}

// CallerAllowed reports whether a request whose X-Skipper-Caller header
// (assign.HeaderCaller, set by Skipper's routers) is caller may be
// served: any request while unassigned, then those the assigned
// function's callers allow (assign.Callers.Allows: all of them when it
// lists none, and only a named caller when it lists some).
func (h *Holder) CallerAllowed(caller string) bool {
	a, ok := h.Assignment()
	return !ok || a.Request.Callers.Allows(caller)
}

type assignResponse struct {
	Ready    bool   `json:"ready"`
	Function string `json:"function"`
	Pod      string `json:"pod,omitempty"`
	PodUID   string `json:"podUID"`
}

func (h *Holder) handleAssign(w http.ResponseWriter, r *http.Request) {
	var req assign.Request
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, h.cfg.MaxBody))
	if err := dec.Decode(&req); err != nil {
		WriteError(w, http.StatusBadRequest, "malformed_body", fmt.Sprintf("decode assign request: %v", err))
		return
	}
	if req.Token == "" || req.Function == "" {
		WriteError(w, http.StatusBadRequest, "malformed_body", "assign request needs token and function")
		return
	}
	now := h.now()
	keys, err := h.publicKeys(now)
	if err != nil {
		h.log.Warn("assign key not loaded", "path", h.cfg.KeyFile, "err", err)
		w.Header().Set("Retry-After", "1")
		WriteError(w, http.StatusServiceUnavailable, "key_unavailable", err.Error())
		return
	}
	claims, err := assign.VerifyRequest(keys, req, h.cfg.PodUID, now)
	if err != nil {
		h.refuse(w, req, err)
		return
	}

	if h.cfg.OnAssign != nil {
		// Decide, hand over and commit as one step: an assign arriving
		// meanwhile waits, so it never sees (nor answers 409 for, nor
		// builds on) an assignment the runtime may yet refuse.
		h.hookMu.Lock()
		defer h.hookMu.Unlock()
	}
	h.mu.Lock()
	prev := h.assigned
	if prev != nil && (prev.Function != req.Function || prev.Request.Oneshot && prev.Request.Claim != req.Claim) {
		h.mu.Unlock()
		WriteJSON(w, http.StatusConflict, assign.Conflict{Reason: assign.ReasonAlreadyAssigned, Function: prev.Function,
			Error: fmt.Sprintf("instance is assigned to %s", prev.Function)})
		return
	}
	// A token assigns once: a replayed one changes nothing. A fresh token
	// for the function held is accepted: the controller retries when it
	// lost the answer, and assigns again to hand over new callers; for a
	// oneshot function only from the claim that won (above).
	if err := h.used.Use(claims, now); err != nil {
		h.mu.Unlock()
		h.refuse(w, req, err)
		return
	}
	mine := &Assignment{Function: req.Function, Request: req, At: now}
	if h.cfg.OnAssign != nil && (prev == nil || !sameHolding(prev.Request, req)) {
		h.mu.Unlock()
		if err := h.cfg.OnAssign(*mine); err != nil {
			h.log.Warn("assign refused: the runtime did not take it", "function", req.Function, "err", err)
			WriteError(w, http.StatusServiceUnavailable, reasonHandoverFailed, err.Error())
			return
		}
		h.mu.Lock()
	}
	h.assigned = mine
	h.mu.Unlock()
	WriteJSON(w, http.StatusOK, assignResponse{Ready: true, Function: req.Function, Pod: h.cfg.PodName, PodUID: h.cfg.PodUID})
	if prev == nil {
		// After the answer is on its way: the claim it decides waits for
		// no log write (and the process reading the log is not woken
		// first).
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		h.log.Info("assigned", "function", req.Function, "oneshot", req.Oneshot)
	}
}

// reasonHandoverFailed is the 503's reason when Config.OnAssign refused
// an assignment.
const reasonHandoverFailed = "handover_failed"

// tokenFormats is HeaderTokenFormats' value: every format assign.Verify
// verifies.
var tokenFormats = strings.Join(assign.Formats, ", ")

// sameHolding reports whether a and b hand the runtime the same thing:
// every field but the token and the claim (which differ on every assign)
// alike, as assign.RequestDigest compares them (absent and empty alike,
// callers in any order).
func sameHolding(a, b assign.Request) bool {
	a.Token, a.Claim, b.Token, b.Claim = "", "", "", ""
	return assign.RequestDigest(a) == assign.RequestDigest(b)
}

// handleAssignment answers what the instance holds (assign.Assignment),
// 404 unassigned when nothing, 404 other_pod when asked as another pod;
// every answer lists the token formats the instance verifies
// (assign.HeaderTokenFormats), which controllers sign its assign in.
func (h *Holder) handleAssignment(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(assign.HeaderTokenFormats, tokenFormats)
	if uid := r.URL.Query().Get("pod"); uid != "" && uid != h.cfg.PodUID {
		WriteError(w, http.StatusNotFound, assign.ReasonOtherPod, fmt.Sprintf("this instance is pod %s, not %s", h.cfg.PodUID, uid))
		return
	}
	a, ok := h.Assignment()
	if !ok {
		WriteError(w, http.StatusNotFound, assign.ReasonUnassigned, "the instance holds no function")
		return
	}
	WriteJSON(w, http.StatusOK, assign.Assignment{Function: a.Function})
}

// refuse answers an assign whose token the instance does not accept (err
// from assign.VerifyRequest or assign.Used.Use): 401 with
// assign.Reason(err), or 503 when the instance holds too many ids to
// take another now.
func (h *Holder) refuse(w http.ResponseWriter, req assign.Request, err error) {
	reason := assign.Reason(err)
	h.log.Warn("assign refused", "function", req.Function, "reason", reason, "err", err)
	status := http.StatusUnauthorized
	if errors.Is(err, assign.ErrTooMany) {
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	}
	WriteError(w, status, reason, err.Error())
}
