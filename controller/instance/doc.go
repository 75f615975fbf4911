// Package instance is the instance side of the contract controller/assign
// defines: what a pool pod serves so that a controller can hand it a
// function. skipper-echo serves it beside its own endpoints; skipper-agent
// serves it beside any image.
//
// A Holder answers POST assign.Path (verify the signed request, accept
// it once, hold the function) and GET assign.Path (what it holds; ?pod=
// names the pod asked for), reads the assign keys from a file, and tells
// its runtime what it holds: Assignment for the request path,
// CallerAllowed for the X-Skipper-Caller check, Config.OnAssign for a
// runtime that hands the assignment on (the agent writes it to files),
// which may refuse it.
//
// Invariants: a Holder is assigned to at most one function for its
// lifetime (a second function gets 409 naming the one it holds; a oneshot
// function's repeat assign is accepted only from the claim that won it);
// a token assigns once (its id is remembered until it expires, at most
// assign.DefaultMaxUsed ids; full, new tokens get 503 rather than an id
// being forgotten); a refused assign changes nothing held (one the
// runtime refused through Config.OnAssign spends its token's id); the
// Holder holds only what its runtime took; the keys are read
// from disk until they load, then again at most once a second, the last
// good ones kept while the file is missing or bad. The assignment lives
// in memory only: a restarted process is unassigned, and the controller
// retires its pod.
//
// How a runtime drives it: RuntimeConfig for its flags (where it serves,
// the pod's identity, the key file, limits); New with RuntimeConfig.Holder;
// Register on the mux it serves; optionally LoadKeys before listening
// (so the first claim reads no file) and NewWarmUp to run its handlers
// once before the pod is ready; then Holder.Run, which keeps the keys and
// serves until its context ends (Serve drains). Answers are JSON written by WriteJSON and WriteError, the
// error body {"error", "reason"} that controllers read the reason of.
package instance
