// Package noderouter is Skipper's per-node HTTP router: it takes every call
// to a function made on its node and proxies it to one of the function's
// instances, asking the control plane only when it knows none.
//
// Every request goes the same four steps, whatever serves its connection:
// parse (the function from x-skipper-function or Host: <name>.<ns>.fn,
// limits), admit (lease.go: a lease of one instance's slot, or an answer:
// a refusal, a queue, a cold start), forward (retry.go: send, and on a
// failed send the one decision next makes: answer, again fresh, or
// elsewhere) and finish (lease.done: counted once, whichever way the
// request ended; its slot goes back once, there or at a failed send).
// Which code serves a connection:
//
//	request                                   served by
//	HTTP/1.1, --forwarder=loop (the default)  event loops (loop*.go): warm
//	                                          GETs and HEADs with no body
//	  any other request, a head split across  handed, with its connection
//	  reads, a cold start, a full instance,   (and lease, once admitted), to
//	  a retry, an answer without a length     the goroutine path (h1conn.go;
//	                                          loop_handovers_total{reason})
//	HTTP/1.1, --forwarder=h1                  goroutine path (h1server.go,
//	                                          h1conn.go, h1forward.go, pool.go)
//	HTTP/1.1, --forwarder=nethttp; all h2c    net/http (nethttp.go)
//	an upgrade (WebSocket)                    tunnelled, holding its slot
//
// Instance connections are kept in one pool (idleshard.go), last in first
// out per instance: a shard per event loop, without a lock, and one locked
// shard (pool.go) the goroutine path and pre-connections share; net/http's
// Transport keeps its own (nethttp.go, the reference).
//
// Around the data plane: the route cache and its instance picks
// (route/), the controllers' ring and one gRPC stream to each
// (controlplane.go, stream.go, members.go), the node-local address and BPF
// steering (steering.go, localaddr/, package bpf), the callers' pod index
// (callercheck.go), instance CPU and memory (usage.go, cgroup/) and
// pre-connections to pool pods (preconnect.go). Run (run.go) owns every
// goroutine and ends them before it returns; Config (config.go, flags.go)
// is the whole configuration, each flag with its SKIPPER_* variable.
//
// The reference, flag by flag and failure by failure (names, limits,
// retries, queues, oneshot, leaks, modes), is "The router, in detail" in
// docs/architecture.md.
package noderouter
