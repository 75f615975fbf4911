// Package noderouter is Skipper's per-node HTTP router: it takes every call
// to a function made on its node and proxies it to one of the function's
// instances, asking the control plane only when it knows none.
//
// Request path (proxy.go): the function is named by the header
// `x-skipper-function: <namespace>/<name>` (a bare name with
// --default-namespace) or by `Host: <name>.<namespace>.fn`; a missing or
// malformed name is a 400. The router looks the function up in its
// route.Cache; a hit picks an instance by the power of two choices over
// the router's local per-instance in-flight counts (route.Assignment.Acquire)
// and forwards on a kept-alive instance connection (at most
// --max-idle-conns-per-host idle per instance), stripping the function
// header and the
// hop-by-hop headers (a Connection field naming the framing, Host or an
// X-Skipper-* field is a 400 bad_connection_header, and the framing is
// written from the parsed one: issue 30), appending this hop to
// X-Forwarded-For and Forwarded (RFC 7239) and keeping a caller's
// X-Forwarded-Host/Proto (set from this hop otherwise). The data plane speaks HTTP/1.1 and h2c (HTTP/2 cleartext
// with prior knowledge); instances are spoken to in HTTP/1.1. Upgrades
// (WebSocket) pass through and hold their instance's slot while open.
//
// Forwarders: one core (proxy.go: parse, pick, forward, finish) serves an
// exchange interface with two implementations. --forwarder=h1 (the
// default; h1server.go, h1conn.go, h1forward.go, pool.go) is the router's
// own HTTP/1.1 path on package h1: the goroutine that reads a caller's
// request writes it to a pooled instance connection (LIFO per instance)
// and copies the answer back itself, with no goroutine hand-off and 3
// allocations per warm request; the caller's connection is watched for its
// going away (a read in a goroutine) only once a request waited 50 ms for
// its answer. Both its connections read and write with raw system calls
// from the net poller's callbacks (rawconn.go: no entersyscall, so the
// runtime's sysmon has no P to take back and sleeps), and a request's last
// write to the instance goes with the wait for its answer. A connection
// that opens with the HTTP/2 preface is handed to net/http's server (h2c).
// --forwarder=nethttp (nethttp.go) serves HTTP/1.1 with net/http and
// httputil.ReverseProxy too; it is kept as the
// reference the tests also run against (see docs/architecture.md for why
// the router has its own path). A function's concurrencyLimit caps the
// requests this router sends to each instance; when every instance is at
// it the request waits in the function's FIFO queue (route.Entry.Wait: at
// most --max-queue requests, each at most --cold-start-timeout; a freed
// slot is handed to the head waiter, a new assignment wakes them all), else
// 503 queue_full / queue_timeout with Retry-After. The queue length is the
// report's queued gauge. A warm request makes no RPC. A miss
// calls GetInstance on the function's owner (ring.Owner of "namespace/name"
// over the controller members), bounded by --cold-start-timeout, with
// concurrent misses of one function sharing one call. gRPC errors become
// HTTP answers in one place (errors.go): NotFound 404, InvalidArgument 400,
// ResourceExhausted / DeadlineExceeded / Unavailable 503 with Retry-After,
// every error a JSON {"error", "reason"} body. A NotFound is remembered in a
// route.Negative for --negative-cache-ttl (at most 1s, so a new Function is
// callable within 2s; at most --negative-cache-size names), so a flood of
// requests for an unknown name costs one GetInstance per TTL.
//
// Retries (retry.go: the decisions and the loop): an attempt that
// failed before any response is sent again, up to --max-attempts sends,
// after a jittered exponential backoff (--retry-backoff-base doubling up to
// --retry-backoff-max) that ends early when the caller goes away or the
// request's timeout passes. An h1 send on a kept-alive connection the
// instance closed while idle (EOF or reset before any response byte, no
// body byte sent) is sent once more on a new connection first, as
// net/http's transport does; a connection idle over a second is checked
// with a non-blocking peek before reuse. A
// dial failure never reached the instance: the instance is evicted and any
// request is resent. A connection that broke before a response byte (reset,
// EOF) may have delivered the request: only idempotent ones (GET, HEAD,
// OPTIONS, PUT, DELETE, TRACE, or any method with an Idempotency-Key) are
// resent, on another instance when there is one, and the instance stays.
// Bodies are streamed, never buffered, so a request of whose body anything
// was read is never resent, whatever its method. When evictions empty the
// cached set the owner is asked again, naming the evicted pods unusable.
//
// Limits: --max-header-bytes (431), --max-body-bytes (default
// 10 MiB; 413 with the JSON body: at once for a Content-Length over it, as
// the read crosses it for a chunked body) and --max-in-flight (default
// 10000 requests at once across all functions; 503 router_overloaded with
// Retry-After); a cache miss waits at most --cold-start-timeout, then 503
// with Retry-After. Answers of limits, and the refusal of a Connection
// field naming the framing, count in skipper_noderouter_rejected_total{reason};
// a request body that breaks its chunked coding is a 400 malformed_body.
//
// Nothing leaks: every instance a request takes (a slot below the
// concurrencyLimit, or a oneshot instance) is given back by a defer in the
// core (proxy.attempt), so also when the exchange breaks after the
// response's header (nethttp: the copy aborts the handler with
// http.ErrAbortHandler, stopped in the exchange's send and raised again
// after the core counted it; h1: both connections are closed); such a
// request counts as 499, 502 or 504 by its cause. A request leaving the queue (caller gone, queue timeout) holds no
// slot. A function the controller removed (an AssignmentUpdate marked
// removed: the Function was deleted) or GetInstance answered NotFound for
// loses its assignment at once, and its cache entry and metric series once
// nothing of it is in flight and one more report carried its final
// counters; an entry with no instance and no request for
// --cache-idle-timeout (default 10m) is dropped too, so reports and series
// grow with the functions in use, not with every function ever called.
//
// Control plane (controlplane.go): the ring members are the ready endpoints
// of the controllers' headless Service (an EndpointSlice informer,
// members.go) or a static --controller-addresses list. The router keeps one
// gRPC connection per controller it has talked to and one Connect stream on
// it: a Hello with the router's identity (node, pod, random incarnation,
// protocol version, mode) and the generations it holds, then one Report per
// --report-interval covering every cached function that controller owns
// (in-flight gauges, cumulative request, error and cold-start counters per
// incarnation, per-instance in-flight and requests). Pushed
// AssignmentUpdates replace a function's set when their generation is newer
// or drop it when removed (see "Nothing leaks"), and are Acked with the generation the router
// routes with. A stream that ends is reopened with jittered exponential
// backoff (--reconnect-min … --reconnect-max).
//
// Node-local address and BPF steering (steering.go, localaddr/): with
// --local-address (default 169.254.20.20; empty: off) Run keeps the address
// on dummy link skipper0, or as lo:skipper where the kernel has no dummy
// links, reconciled every --local-address-interval, and serves the data
// plane on it at --local-port besides --listen; failing to add it fails
// start-up (it needs CAP_NET_ADMIN). With --bpf=auto|required the bpf
// package's connect4/6 programs are attached to --bpf-cgroup (default: the
// cgroup2 mount) and pinned under --bpf-pin-dir, --bpf-vips are steered to
// local-address:local-port, and a heartbeat every --bpf-max-age/4 keeps them
// steering; on shutdown the router withdraws its liveness first, so new
// calls fail open to the skipper Service at once while in-flight ones
// drain, and leaves the pins (failing open) for the next router to adopt.
// While steering is on, the router's own dials (instances, controllers)
// carry bpf.DefaultSkipMark and are never rewritten. --bpf=auto runs without
// steering when the programs cannot load (logged with the reason;
// skipper_noderouter_bpf_mode{mode="failed"}); --bpf=required fails
// start-up. The BPF counters are read from the maps at scrape time.
// `skipper-noderouter bpf-cleanup` (cleanup.go) detaches and unpins the
// steering and removes the address: the uninstall path.
//
// Lifecycle: Run parses the configuration (Config, flags with SKIPPER_*
// environment fallbacks), serves the data plane on --listen and /metrics,
// /healthz, /readyz on --admin-listen. On cancellation it fails /readyz
// and keeps serving for --drain-delay, stops accepting, lets in-flight
// requests finish within --shutdown-timeout, sends one last report on
// every open stream (final counters, nothing in flight), then closes the
// streams and stops the informer. Every goroutine belongs to run, to the control
// plane (stream loops, GetInstance calls) or to the HTTP servers, and ends
// before Run returns.
//
// Oneshot functions (config.oneshot): every request gets a fresh instance
// from GetInstance (its `instance` field; never the shared set, never a
// call shared with another request, so one GetInstance per request by
// design) and the router calls ReleaseInstance on the owner once the
// response has ended, also when the caller went away. A cold miss shared by
// several requests leaves its instance as a spare for the first of them;
// a spare nobody took is released after --cold-start-timeout and on
// shutdown.
//
// Instance resources (usage.go, cgroup/): with --cgroup-root (default "/";
// empty: off) the router reads, once per --report-interval, the cgroups of
// the cached instances whose Node is this router's node (hierarchies from
// /proc/self/mountinfo: cgroup2 where it has the controller, else v1 cpuacct /
// memory; the pod's directory found below --cgroup-root by the kubelet's
// naming) and reports cpu_millicores (usage delta between samples) and
// memory_bytes (working set) per instance. Instances on other nodes, or
// whose cgroup is not found, are reported without them.
//
// Modes: --mode=daemonset (one router per node, hostNetwork) or
// --mode=sidecar (a container in a caller's pod): one code path; a sidecar
// serves calls on loopback only (--listen defaults to 127.0.0.1:8380 and
// must be loopback; --admin-listen defaults to 127.0.0.1:8381 and may be
// the pod IP, where the kubelet probes it), keeps no node-local address,
// runs --bpf=off and reads no cgroups, and says mode "sidecar" in its
// Hello.
//
// Not used: bpf.OriginalDestination in the proxy. The function comes from
// the request (header or Host), never from the address the caller dialled,
// so a steered connection and one to the node-local address or node IP are
// served alike.
package noderouter
