// Package echo is the skipper-echo runtime (see the command's
// documentation for its endpoints): Config and its flags, the Server
// handler, and Run, which serves until its context ends and then drains.
//
// Invariants: an instance is assigned to at most one function for its
// lifetime (a second function gets 409); a token assigns once (its id is
// remembered until it expires, at most assign.DefaultMaxUsed ids); the
// assign keys are read from disk until they load, then again at most once
// a second, the last good ones kept while the file is missing or bad;
// every behaviour knob is bounded (sleep by --max-sleep, bodies by
// --max-body).
package echo
