package noderouter

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
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

// resolver is the control plane as the request path sees it.
type resolver interface {
	// resolve fills the cache on a miss: it asks the function's owner for
	// the instance set (GetInstance), stores it and returns the entry and
	// the assignment now held. known is the generation the router holds
	// (0: none); unusable are pod UIDs that just failed to dial.
	// who is the caller the owner checks the function's callers against
	// before it claims anything.
	resolve(ctx context.Context, ref route.Ref, known uint64, unusable []string, who caller) (*route.Entry, *route.Assignment, error)
	// oneshot returns a fresh instance of a oneshot function for one
	// request.
	oneshot(ctx context.Context, ref route.Ref, who caller) (*route.Instance, error)
	// release gives a oneshot instance back after its request
	// (ReleaseInstance); failures are logged and counted, not returned.
	release(ref route.Ref, podUID string)
}

// exchange is one caller's request as the forwarding core sees it,
// whichever server read it: h1 (the router's own HTTP/1.1 path, h1conn.go)
// or nethttp (net/http and httputil.ReverseProxy: h2c, and HTTP/1.1 with
// --forwarder=nethttp, nethttp.go). The core passes each step once: parse
// (the name), pick (cache, limits, GetInstance, an instance), forward
// (send, with retries in retry.go), finish (answer, count).
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
	// ctx ends when the caller goes away. Only the waits use it
	// (GetInstance, a queue, a backoff): asking for it may cost a watch
	// of the caller's connection.
	ctx() context.Context
	// gone reports that the caller went away, as far as the exchange
	// knows without asking.
	gone() bool
	// send forwards the request to in once, bounded by deadline (zero:
	// none), and relays the response.
	send(in *route.Instance, deadline time.Time) result
	// bodyStarted reports that some of the request body was sent.
	bodyStarted() bool
	// failedBefore is a first send an event loop made of this request and
	// that failed before any response (nil: none, as a rule): the core
	// goes on from there as after its own failed send. Asked once per
	// request.
	failedBefore() *priorSend
	// callerAddr is the caller's source address (the zero Addr when not
	// known), which tells who the caller is (spec.callers).
	callerAddr() netip.Addr
	// setCaller has the request forwarded with X-Skipper-Caller: account
	// (a function that lists callers; set before send).
	setCaller(account string)
	// answer writes the router's own answer; function names it ("" when
	// unnamed).
	answer(a answer, function string)
}

// result is how one send ended.
type result struct {
	// status is the instance's response status as relayed (0: none).
	status int
	// err: the exchange failed before a response head reached the
	// caller; the core may retry or answers for it.
	err error
	// aborted is the code label of an exchange that broke after the
	// response head went to the caller (499 the caller went away, 504 the
	// request timed out, 502 the instance broke off); 0 otherwise.
	aborted int
}

// proxy is the data-plane core: name → cache → instance → forward.
type proxy struct {
	log      *slog.Logger
	m        *metrics
	cache    *route.Cache
	negative *route.Negative // nil: off
	resolver resolver
	// identify tells who holds a caller's address (spec.callers).
	identify         identifier
	defaultNamespace string
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

func newProxy(cfg Config, log *slog.Logger, m *metrics, cache *route.Cache, negative *route.Negative, res resolver) *proxy {
	p := &proxy{
		log:              log,
		m:                m,
		cache:            cache,
		negative:         negative,
		resolver:         res,
		identify:         unknownCaller,
		defaultNamespace: cfg.DefaultNamespace,
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
func (p *proxy) parse(ex exchange) (route.Ref, error) {
	return p.parseName(ex.functionHeader(), ex.host())
}

// parseName finds the function named by X-Skipper-Function's value fh
// ("" when absent), else by the Host host.
func (p *proxy) parseName(fh, host string) (route.Ref, error) {
	if fh != "" {
		return route.ParseHeader(fh, p.defaultNamespace)
	}
	ref, ok, err := route.ParseHost(host)
	if !ok {
		return route.Ref{}, route.ErrNoFunction
	}
	return ref, err
}

// serve takes one request through the core.
func (p *proxy) serve(ex exchange) {
	start := time.Now()
	// A request an event loop sent once already keeps its start (and so
	// its deadline).
	ps := ex.failedBefore()
	if ps != nil {
		start = ps.start
	}
	ref, err := p.parse(ex)
	if err != nil {
		p.finish(ex, nil, parseAnswer(err), ref)
		return
	}
	// The limits below answer with the entry (counted on the function)
	// when the cache holds one, never with a name the caller may have made
	// up (their answers are not known).
	e, a := p.cache.Lookup(ref)
	if p.maxInFlight > 0 {
		defer p.inFlight.Add(-1)
		if p.inFlight.Add(1) > p.maxInFlight {
			p.finish(ex, e, overloadedAnswer(p.maxInFlight), ref)
			return
		}
	}
	if p.maxBodyBytes > 0 && ex.contentLength() > p.maxBodyBytes {
		// Known too large before a byte of it is read: no instance, no
		// GetInstance. A body of unknown length is limited as it streams.
		p.finish(ex, e, tooLargeAnswer(p.maxBodyBytes), ref)
		return
	}

	var waited time.Duration // GetInstance and retry backoff, not the router's own work
	if a == nil || (len(a.Instances) == 0 && !a.Config.Oneshot) {
		if p.negative.Contains(ref, start) {
			p.m.cacheNegative.Inc()
			p.finish(ex, nil, unknownAnswer(ref), ref)
			return
		}
		p.m.cacheMiss.Inc()
		var known uint64
		if a != nil {
			known = a.Generation
		}
		t := time.Now()
		e, a, err = p.resolver.resolve(ex.ctx(), ref, known, ps.dead(), p.callerAt(ex.callerAddr()))
		waited += time.Since(t)
		if err != nil {
			ans, _ := controllerAnswer(err)
			p.finish(ex, nil, ans, ref)
			return
		}
	} else {
		p.m.cacheHit.Inc()
	}
	if a.Config.Callers != nil {
		who := p.callerAt(ex.callerAddr())
		if ans, ok := callerRefused(a.Config.Callers, who, ref); !ok {
			p.finish(ex, e, ans, ref)
			return
		}
		ex.setCaller(who.id.Account)
	}

	timeout := p.requestTimeout
	if a.Config.Timeout > 0 {
		timeout = a.Config.Timeout
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = start.Add(timeout)
	}
	f := p.forward(ex, ref, e, a, deadline, ps)
	waited += f.waited
	switch {
	case f.ans.status != 0:
		p.finish(ex, f.e, f.ans, ref)
	case f.res.aborted != 0:
		p.aborted(f, start)
	default:
		p.served(f, start, time.Now(), waited)
	}
}

// served counts a request an instance answered, from start to end: f.upstream
// of it went to the sends, waited to GetInstance and backoff.
func (p *proxy) served(f forwarded, start, end time.Time, waited time.Duration) {
	fm := p.m.function(f.e.Key)
	f.e.Requests.Add(1)
	fm.count(f.res.status).Inc()
	total := end.Sub(start)
	p.m.upstream.Observe(f.upstream.Seconds())
	p.m.overhead.Observe((total - f.upstream - waited).Seconds())
	fm.seconds.Observe(total.Seconds())
}

// attempt sends the request to in (whose slot take handed out) once, and
// gives the instance back (release) on every way out of the send: a
// response, a transport error, an exchange broken after the response head.
// Issue 13: a release after the forward instead of deferred was skipped by
// the panic with which net/http aborts such a handler, and the slot leaked
// for good (a function at concurrencyLimit 1 stuck, drains waiting their
// timeout, oneshot pods living out their lease). The pairing lives here,
// in the core, so that it holds whatever forwards the request.
func (p *proxy) attempt(ex exchange, ref route.Ref, e *route.Entry, in *route.Instance, oneshot bool, deadline time.Time) result {
	defer p.release(ref, e, in, oneshot)
	e.InFlight.Add(1)
	in.Requests.Add(1)
	defer e.InFlight.Add(-1)
	return ex.send(in, deadline)
}

// release gives back what take handed out: a oneshot instance to the
// control plane (after its one request, also when the caller went away),
// or a slot to its function's entry, which may hand it to a queued request.
func (p *proxy) release(ref route.Ref, e *route.Entry, in *route.Instance, oneshot bool) {
	if oneshot {
		p.resolver.release(ref, in.PodUID)
		return
	}
	e.Release(in)
}

// aborted counts a request whose exchange broke after the response's
// header.
func (p *proxy) aborted(f forwarded, start time.Time) {
	e := f.e
	e.Requests.Add(1)
	e.Errors.Add(1)
	p.m.requests.WithLabelValues(e.Key, codeLabel(f.res.aborted)).Inc()
	p.m.function(e.Key).seconds.Observe(time.Since(start).Seconds())
	pod := ""
	if f.instance != nil {
		pod = f.instance.Pod
	}
	p.log.Debug("exchange broke after the response header", "function", e.Key, "pod", pod, "status", f.res.status, "code", f.res.aborted)
}

// take returns the instance for the next attempt with its slot held, or the
// answer to give instead. A oneshot function gets a fresh instance from the
// control plane. Otherwise the power of two choices over a's instances
// below the concurrency limit, skipping those that failed this request when
// others are left; when every instance is at the limit the request queues
// (at most --max-queue per function, waiting at most --cold-start-timeout).
func (p *proxy) take(ex exchange, ref route.Ref, e *route.Entry, a *route.Assignment, failed []*route.Instance) (*route.Instance, answer) {
	if a.Config.Oneshot {
		in, err := p.resolver.oneshot(ex.ctx(), ref, p.callerAt(ex.callerAddr()))
		if err != nil {
			ans, _ := controllerAnswer(err)
			return nil, ans
		}
		return in, answer{}
	}
	limit := a.Config.ConcurrencyLimit
	in := a.Acquire(rand.Uint64(), limit, failed)
	if in == nil && len(failed) > 0 {
		// Every instance left failed this request once (dial failures are
		// evicted): try the least loaded again rather than fail.
		in = a.Acquire(rand.Uint64(), limit, nil)
	}
	if in != nil {
		return in, answer{}
	}
	noInstances := answer{status: http.StatusServiceUnavailable, reason: reasonNoInstances,
		msg: "the function has no usable instance", retryAfter: true, known: true}
	if limit == 0 || len(a.Instances) == 0 {
		return nil, noInstances
	}
	if p.maxQueue == 0 {
		return nil, queueFullAnswer(limit)
	}
	ctx := ex.ctx()
	qctx, cancel := context.WithTimeout(ctx, p.coldStartTimeout)
	defer cancel()
	p.m.queued.Inc()
	in, err := e.Wait(qctx, p.maxQueue)
	p.m.queued.Dec()
	switch {
	case in != nil:
		// Before the context cases: the slot is held, and a caller gone
		// meanwhile is answered by the attempt, which gives it back.
		return in, answer{}
	case errors.Is(err, route.ErrQueueFull):
		return nil, queueFullAnswer(limit)
	case ctx.Err() != nil:
		return nil, upstreamAnswer(ctx.Err())
	case err != nil:
		return nil, answer{status: http.StatusServiceUnavailable, reason: reasonQueueTimeout,
			msg: "every instance stayed at the concurrency limit for the cold-start timeout", retryAfter: true, known: true}
	default:
		return nil, noInstances // the set was withdrawn while the request waited
	}
}

// finish answers a request the router could not forward and counts it.
func (p *proxy) finish(ex exchange, e *route.Entry, ans answer, ref route.Ref) {
	ex.answer(ans, p.count(e, ans, ref))
}

// count counts the router's own answer ans to a request for ref (e: its
// entry, nil when the cache holds none) and returns the function name the
// answer's body gives ("" when the request named none).
func (p *proxy) count(e *route.Entry, ans answer, ref route.Ref) string {
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
