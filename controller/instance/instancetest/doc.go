// Package instancetest drives the instance contract in tests: an assign
// key pair whose public half a Holder under test reads from a file,
// assign bodies signed with it, and the POST that delivers them. Tests of
// package instance and of the runtimes that serve it (skipper-echo) use
// it; it imports nothing of Skipper but controller/assign.
package instancetest
