// Package dataplane is the router's request path: it takes a caller's
// request to a function to one of the function's instances and relays the
// answer. Package noderouter wires it to the control plane (a Resolver),
// the callers' pod index (an Identifier) and the listeners.
//
// Every request goes the same four steps, whatever serves its connection:
// parse (the function from x-skipper-function or the Host: <name>.<ns>.fn,
// or a name of the Function's own Service, route.Hosts; limits), admit (lease.go: a lease of one instance's slot, or an answer:
// a refusal, a queue, a cold start), forward (retry.go: send, and on a
// failed send the one decision next makes: answer, again fresh, or
// elsewhere) and finish (lease.done: counted once, whichever way the
// request ended; its slot goes back once, there or at a failed send).
// Which code serves a connection (Server, by Options.Forwarder):
//
//	request                                   served by
//	HTTP/1.1, ForwarderLoop (the default)     event loops (loop*.go): warm
//	                                          GETs and HEADs with no body
//	  any other request, a head split across  handed, with its connection
//	  reads, a cold start, a full instance,   (and lease, once admitted), to
//	  a retry, an answer without a length     the goroutine path (h1conn.go;
//	                                          loop_handovers_total{reason})
//	HTTP/1.1, ForwarderH1                     goroutine path (h1server.go,
//	                                          h1conn.go, h1forward.go, pool.go)
//	HTTP/1.1, ForwarderNethttp; all h2c       net/http (nethttp.go)
//	an upgrade (WebSocket)                    tunnelled, holding its slot
//
// Instance connections are kept in one pool (idleshard.go), last in first
// out per instance: a shard per event loop, without a lock, and one locked
// shard (pool.go) the goroutine path and pre-connections (preconnect.go)
// share; net/http's Transport keeps its own (nethttp.go, the reference).
//
// The reference, flag by flag and failure by failure (names, limits,
// retries, queues, oneshot, leaks, modes), is "The router, in detail" in
// docs/architecture.md.
package dataplane
