package dataplane

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"skipper.dev/skipper/noderouter/route"
)

// HeaderFunction names the function a request is for. It is removed before
// the request is forwarded.
const HeaderFunction = "X-Skipper-Function"

// HeaderCaller tells an instance of a function that lists callers
// (spec.callers) who the request came from: "<namespace>/<serviceaccount>"
// of the calling pod, as the router identified it. A caller's own is
// always removed.
const HeaderCaller = "X-Skipper-Caller"

// Resolver is the control plane as the request path sees it (package
// noderouter's controlPlane).
type Resolver interface {
	// Resolve fills the cache on a miss: it asks the function's owner for
	// the instance set (GetInstance), stores it and returns the entry and
	// the assignment now held. known is the generation the router holds
	// (0: none); unusable are pod UIDs that just failed to dial.
	// who is the caller the owner checks the function's callers against
	// before it claims anything.
	Resolve(ctx context.Context, ref route.Ref, known uint64, unusable []string, who Caller) (*route.Entry, *route.Assignment, error)
	// Oneshot returns a fresh instance of a oneshot function for one
	// request.
	Oneshot(ctx context.Context, ref route.Ref, who Caller) (*route.Instance, error)
	// Release gives a oneshot instance back after its request
	// (ReleaseInstance); failures are logged and counted, not returned.
	Release(ref route.Ref, podUID string)
}

// exchange is one caller's request as the pipeline sees it, whichever
// server read it: h1 (the router's own HTTP/1.1 path, h1conn.go) or
// nethttp (net/http and httputil.ReverseProxy: h2c, and HTTP/1.1 with
// --forwarder=nethttp, nethttp.go). It does the wire I/O; serve takes it
// through admit, forward and the lease's end once.
type exchange interface {
	// functionHeader is X-Skipper-Function's value, "" when absent.
	functionHeader() string
	// host is the Host the caller asked for.
	host() string
	method() string
	// idempotencyKey reports an Idempotency-Key header.
	idempotencyKey() bool
	// contentLength is the body's declared length: -1 when unknown
	// (chunked), 0 without a body.
	contentLength() int64
	// callerAddr is the caller's source address (the zero Addr when not
	// known), which tells who the caller is (spec.callers).
	callerAddr() netip.Addr
	// handed is the lease of a request an event loop admitted and sent
	// once, and handed over after that send failed before any response
	// (nil: none, as a rule): serve goes on from there. Asked once per
	// request.
	handed() *lease
	// ctx ends when the caller goes away. Only the waits use it
	// (GetInstance, a queue, a backoff): asking for it may cost a watch
	// of the caller's connection.
	ctx() context.Context
	// gone reports that the caller went away, as far as the exchange
	// knows without asking.
	gone() bool
	// setCaller has the request forwarded with X-Skipper-Caller: account
	// ("": none; set before send).
	setCaller(account string)
	// send forwards the request to in once, bounded by deadline (zero:
	// none), and relays the response; fresh: on a new connection, not a
	// kept-alive one (next's moveFresh).
	send(in *route.Instance, deadline time.Time, fresh bool) result
	// bodyStarted reports that some of the request body was sent.
	bodyStarted() bool
	// answer writes the router's own answer; function names it ("" when
	// unnamed).
	answer(a answer, function string)
}

// result is how one send ended.
type result struct {
	// status is the instance's response status as relayed (0: none).
	status int
	// err: the exchange failed before a response head reached the
	// caller; the pipeline may send again or answers for it.
	err error
	// reused: the send went out on a kept-alive connection.
	reused bool
	// aborted is the code label of an exchange that broke after the
	// response head went to the caller (499 the caller went away, 504 the
	// request timed out, 502 the instance broke off); 0 otherwise.
	aborted int
}

// Proxy is the data-plane core: name → cache → instance → forward. New
// makes one; Server serves callers with it.
type Proxy struct {
	opts     Options
	log      *slog.Logger
	m        *Metrics
	cache    *route.Cache
	negative *route.Negative // nil: off
	resolver Resolver
	// identify tells who holds a caller's address (spec.callers).
	identify         Identifier
	defaultNamespace string
	hosts            route.Hosts
	requestTimeout   time.Duration
	maxAttempts      int
	backoffBase      time.Duration
	backoffMax       time.Duration
	maxBodyBytes     int64 // 0: no limit
	maxQueue         int   // per function; 0: no queue
	maxInFlight      int64 // router-wide; 0: no limit
	coldStartTimeout time.Duration
	maxHeaderBytes   int
	// dialMark is the SO_MARK of instance dials (bpf.DefaultSkipMark
	// with steering on; 0: none), for the event loops' own dials.
	dialMark uint32

	// inFlight counts the requests past parsing (for --max-in-flight;
	// kept only when it is on).
	inFlight atomic.Int64

	// The forwarders: nethttp serves h2c always and HTTP/1.1 with
	// --forwarder=nethttp; pool holds the h1 forwarder's connections.
	nethttp *nethttpForwarder
	pool    *upstreamPool
}

func New(cfg Options, log *slog.Logger, m *Metrics, cache *route.Cache, negative *route.Negative, res Resolver) *Proxy {
	p := &Proxy{
		opts:             cfg,
		log:              log,
		m:                m,
		cache:            cache,
		negative:         negative,
		resolver:         res,
		identify:         unknownCaller,
		defaultNamespace: cfg.DefaultNamespace,
		hosts:            route.NewHosts(cfg.ClusterDomain),
		requestTimeout:   cfg.RequestTimeout,
		maxAttempts:      cfg.MaxAttempts,
		backoffBase:      cfg.RetryBackoffBase,
		backoffMax:       cfg.RetryBackoffMax,
		maxBodyBytes:     cfg.MaxBodyBytes,
		maxQueue:         cfg.MaxQueue,
		maxInFlight:      int64(cfg.MaxInFlight),
		coldStartTimeout: cfg.ColdStartTimeout,
		maxHeaderBytes:   cfg.MaxHeaderBytes,
		pool:             newUpstreamPool(instanceDialer(cfg, nil), cfg.MaxIdleConnsPerHost, cfg.IdleConnTimeout),
	}
	p.nethttp = newNethttpForwarder(cfg, p)
	return p
}

// parse finds the function a request names: the header first, then Host.
func (p *Proxy) parse(ex exchange) (route.Ref, error) {
	return p.parseName(ex.functionHeader(), ex.host())
}

// parseName finds the function named by X-Skipper-Function's value fh
// ("" when absent), else by the Host host.
func (p *Proxy) parseName(fh, host string) (route.Ref, error) {
	if fh != "" {
		return route.ParseHeader(fh, p.defaultNamespace)
	}
	ref, ok, err := p.hosts.Parse(host)
	if !ok {
		return route.Ref{}, route.ErrNoFunction
	}
	return ref, err
}

// serve takes one request through the pipeline: admit, forward, and the
// lease's end, or the router's own answer. l is the exchange's room for
// its lease (unless an event loop handed one over).
func (p *Proxy) serve(ex exchange, l *lease) {
	if h := ex.handed(); h != nil {
		l = h
	} else {
		q := request{fh: ex.functionHeader(), length: ex.contentLength(), from: ex.callerAddr(), start: time.Now(),
			idempotent: idempotent(ex.method(), ex.idempotencyKey())}
		if q.fh == "" {
			q.host = ex.host()
		}
		v := p.admit(l, q, ex.ctx)
		if v.lease == nil {
			ex.answer(v.ans, v.fn)
			return
		}
	}
	p.forward(ex, l)
}

// served counts a request an instance answered with status, from its
// start to end: l.upstream of it went to the sends, l.waited to
// GetInstance, the queue and backoff.
func (p *Proxy) served(l *lease, status int, end time.Time) {
	l.e.Requests.Add(1)
	total := end.Sub(l.start)
	p.m.upstream.Observe(l.upstream.Seconds())
	p.m.overhead.Observe((total - l.upstream - l.waited).Seconds())
	p.m.Served(l.e.Key, status, total.Seconds())
}

// aborted counts a request whose exchange broke after the response's
// header (code: 499, 502 or 504).
func (p *Proxy) aborted(l *lease, status, code int) {
	e := l.e
	e.Requests.Add(1)
	e.Errors.Add(1)
	p.m.requests.WithLabelValues(e.Key, codeLabel(code)).Inc()
	p.m.function(e.Key).seconds.Observe(time.Since(l.start).Seconds())
	pod := ""
	if l.in != nil {
		pod = l.in.Pod
	}
	p.log.Debug("exchange broke after the response header", "function", e.Key, "pod", pod, "status", status, "code", code)
}

// finish ends l with o, the router's own answer, and writes it.
func (p *Proxy) finish(ex exchange, l *lease, o outcome) {
	ex.answer(o.ans, l.done(o))
}

// count counts the router's own answer ans to a request for ref (e: its
// entry, nil when the cache holds none) and returns the function name the
// answer's body gives ("" when the request named none).
func (p *Proxy) count(e *route.Entry, ans answer, ref route.Ref) string {
	label := ""
	if e != nil {
		e.Requests.Add(1)
		e.Errors.Add(1)
		label = e.Key
	} else if ans.known {
		label = ref.String()
	}
	p.m.requests.WithLabelValues(label, codeLabel(ans.status)).Inc()
	if slices.Contains(rejectReasons, ans.reason) {
		p.m.rejected.WithLabelValues(ans.reason).Inc()
	}
	if ref.Name != "" {
		return ref.String()
	}
	return ""
}
