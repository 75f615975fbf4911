// Package noderouter is Skipper's per-node HTTP router: it takes every call
// to a function made on its node and proxies it to one of the function's
// instances, asking the control plane only when it knows none.
//
// The request path is package dataplane (one pipeline, parse → admit →
// forward → finish, whatever transport carried the request; the event
// loops serve the warm requests by default, --forwarder=loop). This
// package wires it to the rest: the route cache and its instance picks
// (route/), the controllers' ring and one gRPC stream to each
// (controlplane.go, stream.go, members.go; the data plane's Resolver), the
// node-local address and BPF steering (steering.go, localaddr/, package
// bpf), the callers' pod index (callerindex.go, callers/; the data plane's
// Identifier), instance CPU and memory (usage.go, cgroup/) and the pod
// watch that feeds pre-connections. Run (run.go) owns every goroutine and
// ends them before it returns; Config (config.go, flags.go) is the whole
// configuration, each flag with its SKIPPER_* variable, the data plane's
// embedded as dataplane.Options.
//
// The reference, flag by flag and failure by failure, is "The router, in
// detail" in docs/architecture.md.
package noderouter
