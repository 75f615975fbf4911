// Package echo is the skipper-echo runtime (see the command's
// documentation for its endpoints): Config and its flags, the Server
// handler, and Run, which serves until its context ends and then drains.
//
// The instance contract (the assign endpoint, its keys, its 409 and
// oneshot rules, the GET of what the instance holds) is served by an
// instance.Holder (package controller/instance), whose invariants hold
// here: an instance is assigned to at most one function for its
// lifetime; a token assigns once; the assign keys are read from disk
// until they load, then again at most once a second. The Server adds the
// echo, which serves only the callers the assignment allows
// (Holder.CallerAllowed), and /healthz; every behaviour knob is bounded
// (sleep by --max-sleep, bodies by --max-body, which bounds an assign's
// body too).
package echo
