package noderouter

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"skipper.dev/skipper/noderouter/route"
)

// HeaderFunction names the function a request is for. It is removed before
// the request is forwarded.
const HeaderFunction = "X-Skipper-Function"

// resolver is the control plane as the request path sees it.
type resolver interface {
	// resolve fills the cache on a miss: it asks the function's owner for
	// the instance set (GetInstance), stores it and returns the entry and
	// the assignment now held. known is the generation the router holds
	// (0: none); unusable are pod UIDs that just failed to dial.
	resolve(ctx context.Context, ref route.Ref, known uint64, unusable []string) (*route.Entry, *route.Assignment, error)
	// oneshot returns a fresh instance of a oneshot function for one
	// request.
	oneshot(ctx context.Context, ref route.Ref) (*route.Instance, error)
	// release gives a oneshot instance back after its request
	// (ReleaseInstance); failures are logged and counted, not returned.
	release(ref route.Ref, podUID string)
}

// proxy is the data-plane handler: name → cache → instance → forward.
type proxy struct {
	log              *slog.Logger
	m                *metrics
	cache            *route.Cache
	negative         *route.Negative // nil: off
	resolver         resolver
	defaultNamespace string
	requestTimeout   time.Duration
	maxAttempts      int
	backoffBase      time.Duration
	backoffMax       time.Duration
	maxBodyBytes     int64 // 0: no limit
	maxQueue         int   // per function; 0: no queue
	maxInFlight      int64 // router-wide; 0: no limit
	coldStartTimeout time.Duration

	// inFlight counts the requests in ServeHTTP past parsing (for
	// --max-in-flight; kept only when it is on).
	inFlight atomic.Int64

	transport *http.Transport
	rp        *httputil.ReverseProxy
}

func newTransport(cfg Config) *http.Transport {
	return &http.Transport{
		Proxy: nil, // instances are on the pod network; never an HTTP proxy
		DialContext: (&net.Dialer{
			Timeout:   cfg.DialTimeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		// The default of 2 idle connections per host makes a busy function
		// open a new connection for most requests.
		MaxIdleConns:          0, // no global cap: the per-host cap bounds it
		MaxIdleConnsPerHost:   cfg.MaxIdleConnsPerHost,
		IdleConnTimeout:       cfg.IdleConnTimeout,
		ExpectContinueTimeout: time.Second,
		// A proxy passes Accept-Encoding through; it must not add gzip and
		// decompress transparently.
		DisableCompression: true,
	}
}

func newProxy(cfg Config, log *slog.Logger, m *metrics, cache *route.Cache, negative *route.Negative, res resolver) *proxy {
	p := &proxy{
		log:              log,
		m:                m,
		cache:            cache,
		negative:         negative,
		resolver:         res,
		defaultNamespace: cfg.DefaultNamespace,
		requestTimeout:   cfg.RequestTimeout,
		maxAttempts:      cfg.MaxAttempts,
		backoffBase:      cfg.RetryBackoffBase,
		backoffMax:       cfg.RetryBackoffMax,
		maxBodyBytes:     cfg.MaxBodyBytes,
		maxQueue:         cfg.MaxQueue,
		maxInFlight:      int64(cfg.MaxInFlight),
		coldStartTimeout: cfg.ColdStartTimeout,
		transport:        newTransport(cfg),
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      p.transport,
		BufferPool:     bufferPool{},
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandler:   recordError,
		ModifyResponse: recordStatus,
		// FlushInterval 0: ReverseProxy already flushes each read at once
		// for responses without a Content-Length (chunked streams) and for
		// text/event-stream; a fixed-length response is written whole.
	}
	return p
}

// attempt is one forwarding of a request, reached from the ReverseProxy
// hooks through the outgoing request's context.
type attempt struct {
	instance *route.Instance
	status   int
	err      error
}

type attemptKey struct{}

func attemptOf(r *http.Request) *attempt { return r.Context().Value(attemptKey{}).(*attempt) }

func rewrite(pr *httputil.ProxyRequest) {
	a := attemptOf(pr.Out)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = a.instance.Address
	pr.Out.Host = pr.In.Host // the instance sees the Host the caller used
	pr.Out.Header.Del(HeaderFunction)
	// Rewrite strips inbound Forwarded and X-Forwarded-*. Keep the chains
	// from callers such as an ingress and append this hop; keep their
	// X-Forwarded-Host/Proto, which describe the original request.
	in := pr.In.Header
	if xff := in["X-Forwarded-For"]; len(xff) > 0 {
		pr.Out.Header["X-Forwarded-For"] = xff
	}
	pr.SetXForwarded()
	for _, h := range [...]string{"X-Forwarded-Host", "X-Forwarded-Proto"} {
		if v := in[h]; len(v) > 0 {
			pr.Out.Header[h] = v
		}
	}
	pr.Out.Header["Forwarded"] = append(slices.Clip(in["Forwarded"]), forwardedElement(pr.In))
}

// forwardedElement is this hop's RFC 7239 Forwarded element: the caller's
// address, the Host it asked for, and the scheme.
func forwardedElement(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr := host
	if strings.Contains(host, ":") {
		addr = `"[` + host + `]"` // IPv6 is quoted and bracketed
	}
	return "for=" + addr + `;host="` + r.Host + `";proto=http`
}

// recordError keeps a transport error for ServeHTTP to handle (retry or
// answer) instead of answering 502 at once.
func recordError(_ http.ResponseWriter, r *http.Request, err error) { attemptOf(r).err = err }

func recordStatus(res *http.Response) error {
	attemptOf(res.Request).status = res.StatusCode
	return nil
}

// parse finds the function a request names: the header first, then Host.
func (p *proxy) parse(r *http.Request) (route.Ref, error) {
	if v := r.Header.Get(HeaderFunction); v != "" {
		return route.ParseHeader(v, p.defaultNamespace)
	}
	ref, ok, err := route.ParseHost(r.Host)
	if !ok {
		return route.Ref{}, route.ErrNoFunction
	}
	return ref, err
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var waited time.Duration // GetInstance and retry backoff, not the router's own work

	ref, err := p.parse(r)
	if err != nil {
		p.finish(w, nil, parseAnswer(err), ref)
		return
	}
	// The limits below answer with the entry (counted on the function)
	// when the cache holds one, never with a name the caller may have made
	// up (their answers are not known).
	e, a := p.cache.Lookup(ref)
	if p.maxInFlight > 0 {
		// Deferred: released however the handler ends, an aborted
		// exchange's panic included.
		defer p.inFlight.Add(-1)
		if p.inFlight.Add(1) > p.maxInFlight {
			p.finish(w, e, overloadedAnswer(p.maxInFlight), ref)
			return
		}
	}
	if p.maxBodyBytes > 0 && r.ContentLength > p.maxBodyBytes {
		// Known too large before a byte of it is read: no instance, no
		// GetInstance. A body of unknown length is limited as it streams.
		p.finish(w, e, tooLargeAnswer(p.maxBodyBytes), ref)
		return
	}

	if a == nil || (len(a.Instances) == 0 && !a.Config.Oneshot) {
		if p.negative.Contains(ref, start) {
			p.m.cacheNegative.Inc()
			p.finish(w, nil, unknownAnswer(ref), ref)
			return
		}
		p.m.cacheMiss.Inc()
		var known uint64
		if a != nil {
			known = a.Generation
		}
		t := time.Now()
		e, a, err = p.resolver.resolve(r.Context(), ref, known, nil)
		waited += time.Since(t)
		if err != nil {
			ans, _ := controllerAnswer(err)
			p.finish(w, nil, ans, ref)
			return
		}
	} else {
		p.m.cacheHit.Inc()
	}

	at := &attempt{}
	ctx := context.WithValue(r.Context(), attemptKey{}, at)
	timeout := p.requestTimeout
	if a.Config.Timeout > 0 {
		timeout = a.Config.Timeout
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	out := r.WithContext(ctx)
	var body *trackedBody
	if r.Body != nil && r.Body != http.NoBody {
		rc := r.Body
		if p.maxBodyBytes > 0 && r.ContentLength < 0 {
			// The transport returns the *http.MaxBytesError of the read that
			// crosses the limit (a 413), and the server closes the caller's
			// connection after the answer.
			rc = http.MaxBytesReader(w, rc, p.maxBodyBytes)
		}
		body = &trackedBody{rc: rc}
		out.Body = body
	}
	defer func() {
		// An exchange that breaks after the response's header (the caller
		// went away, the instance died mid-body) aborts the handler with
		// http.ErrAbortHandler; attempt has given the instance back by
		// now. Count the request, then let the panic go on to net/http,
		// which drops the caller's connection.
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				p.aborted(ctx, r, e, at, start)
			}
			panic(v)
		}
	}()

	var upstream time.Duration
	// failed are the instances that failed this request, dead the pod UIDs
	// of those evicted; both stay nil on the warm path.
	var failed []*route.Instance
	var dead []string
	for n := 1; ; n++ {
		oneshot := a.Config.Oneshot
		in, ans, w8, up := p.attempt(w, r, out, at, ref, e, a, failed)
		waited += w8
		upstream += up
		if ans.status != 0 {
			p.finish(w, e, ans, ref)
			return
		}
		if at.err == nil {
			break
		}
		if ctx.Err() != nil {
			// The caller went away or the request timed out: answer for
			// that (499/504), whatever the transport made of it.
			at.err = ctx.Err()
		}
		f := classify(at.err, ctx.Err() != nil)
		if f == failDial && !oneshot {
			// The instance is gone (or never was): evict it, retried or not.
			// A broken connection is not enough: the instance may be alive.
			if p.cache.Evict(ref, in.PodUID) {
				p.m.evictions.Inc()
				p.log.Info("instance unreachable; evicted", "function", e.Key, "pod", in.Pod, "address", in.Address, "err", at.err)
			}
			dead = append(dead, in.PodUID)
		}
		if n >= p.maxAttempts || !retryable(f, idempotent(r.Method, r.Header.Get(HeaderIdempotencyKey) != ""), body.started()) {
			p.finish(w, e, upstreamAnswer(at.err), ref)
			return
		}
		p.m.retries.Inc()
		failed = append(failed, in)
		if f != failDial {
			p.log.Info("connection to instance broke before a response; retrying", "function", e.Key, "pod", in.Pod, "err", at.err)
		}
		t := time.Now()
		if err := sleep(ctx, backoff(n, p.backoffBase, p.backoffMax, rand.Float64())); err != nil {
			p.finish(w, e, upstreamAnswer(err), ref)
			return
		}
		waited += time.Since(t)
		if _, next := p.cache.Lookup(ref); next != nil && (len(next.Instances) > 0 || next.Config.Oneshot) {
			a = next
			continue
		}
		// The cached set ran dry: ask the owner, naming what failed to dial.
		t = time.Now()
		ne, na, err := p.resolver.resolve(r.Context(), ref, a.Generation, dead)
		waited += time.Since(t)
		if err != nil {
			ans, _ := controllerAnswer(err)
			p.finish(w, e, ans, ref)
			return
		}
		e, a = ne, na
	}

	e.Requests.Add(1)
	p.m.requests.WithLabelValues(e.Key, codeLabel(at.status)).Inc()
	total := time.Since(start)
	p.m.upstream.Observe(upstream.Seconds())
	p.m.overhead.Observe((total - upstream - waited).Seconds())
	p.m.functionSeconds.WithLabelValues(e.Key).Observe(total.Seconds())
}

// attempt is one try of a request: it takes an instance (take), forwards
// out to it once, and gives the instance back (release) on every way out
// of the forward: a response, a transport error, and the panic with which
// the copy aborts the handler when the exchange breaks after the
// response's header (http.ErrAbortHandler), which goes on up. Issue 13: a
// release after the forward instead of deferred was skipped by that panic,
// and the slot leaked for good (a function at concurrencyLimit 1 stuck,
// drains waiting their timeout, oneshot pods living out their lease). The
// pairing lives here, in the handler and not in a ReverseProxy hook, so
// that it holds whatever forwards the request. ans is the answer to give
// when no instance could be taken; waited is the time spent taking one,
// upstream the exchange's.
func (p *proxy) attempt(w http.ResponseWriter, r, out *http.Request, at *attempt, ref route.Ref, e *route.Entry, a *route.Assignment, failed []*route.Instance) (in *route.Instance, ans answer, waited, upstream time.Duration) {
	t := time.Now()
	in, ans = p.take(r.Context(), ref, e, a, failed)
	waited = time.Since(t)
	if ans.status != 0 {
		return nil, ans, waited, 0
	}
	defer p.release(ref, e, in, a.Config.Oneshot)
	*at = attempt{instance: in}
	upstream = p.forward(w, out, e, in)
	return in, answer{}, waited, upstream
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
// header: 499 when the caller went away, 504 at the request timeout, 502
// when the instance broke off.
func (p *proxy) aborted(ctx context.Context, r *http.Request, e *route.Entry, at *attempt, start time.Time) {
	code := http.StatusBadGateway
	switch {
	case r.Context().Err() != nil:
		code = StatusClientClosed
	case ctx.Err() != nil:
		code = http.StatusGatewayTimeout
	}
	e.Requests.Add(1)
	e.Errors.Add(1)
	p.m.requests.WithLabelValues(e.Key, codeLabel(code)).Inc()
	p.m.functionSeconds.WithLabelValues(e.Key).Observe(time.Since(start).Seconds())
	pod := ""
	if at.instance != nil {
		pod = at.instance.Pod
	}
	p.log.Debug("exchange broke after the response header", "function", e.Key, "pod", pod, "status", at.status, "code", code)
}

// take returns the instance for the next attempt with its slot held, or the
// answer to give instead. A oneshot function gets a fresh instance from the
// control plane. Otherwise the power of two choices over a's instances
// below the concurrency limit, skipping those that failed this request when
// others are left; when every instance is at the limit the request queues
// (at most --max-queue per function, waiting at most --cold-start-timeout).
func (p *proxy) take(ctx context.Context, ref route.Ref, e *route.Entry, a *route.Assignment, failed []*route.Instance) (*route.Instance, answer) {
	if a.Config.Oneshot {
		in, err := p.resolver.oneshot(ctx, ref)
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

// forward sends out to in (whose slot the caller holds) once and returns
// the time it took. The function's in-flight count is released even when
// the copy aborts the handler.
func (p *proxy) forward(w http.ResponseWriter, out *http.Request, e *route.Entry, in *route.Instance) time.Duration {
	e.InFlight.Add(1)
	in.Requests.Add(1)
	defer e.InFlight.Add(-1)
	t := time.Now()
	p.rp.ServeHTTP(w, out)
	return time.Since(t)
}

// finish answers a request the router could not forward and counts it.
func (p *proxy) finish(w http.ResponseWriter, e *route.Entry, ans answer, ref route.Ref) {
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
	fn := ""
	if ref.Name != "" {
		fn = ref.String()
	}
	ans.write(w, fn)
}

// trackedBody lets a request be sent again after an attempt that read none
// of its body (a dial failure, a connection broken first): it records
// whether the transport read anything, and its Close (which the transport
// calls even when the dial fails) closes the caller's body only once
// something was read. The server closes the caller's body after the handler
// in every case.
type trackedBody struct {
	rc   io.ReadCloser
	read atomic.Bool // set by the transport's writer goroutine
}

func (b *trackedBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.rc.Read(p)
}

func (b *trackedBody) Close() error {
	if b.read.Load() {
		return b.rc.Close()
	}
	return nil
}

// started reports whether any of the body was sent; nil means no body.
func (b *trackedBody) started() bool { return b != nil && b.read.Load() }

// bufferPool reuses the 32 KiB copy buffers of the ReverseProxy.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }
