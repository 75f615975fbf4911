// Package echo is the skipper-echo runtime (see the command's
// documentation for its endpoints): Config and its flags, the Server
// handler, and Run, which serves until its context ends and then drains.
//
// Invariants: an instance is assigned to at most one function for its
// lifetime (a second function gets 409); the assign key is read from disk
// until it loads once and then kept; every behaviour knob is bounded
// (sleep by --max-sleep, bodies by --max-body).
package echo
