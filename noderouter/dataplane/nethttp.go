package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"skipper.dev/skipper/noderouter/h1"
	"skipper.dev/skipper/noderouter/route"
)

// nethttpForwarder forwards requests that net/http's server read: h2c
// always, and HTTP/1.1 with --forwarder=nethttp. It sends them with
// httputil.ReverseProxy over an http.Transport (HTTP/1.1 to instances).
type nethttpForwarder struct {
	p         *Proxy
	transport *http.Transport
	rp        *httputil.ReverseProxy
}

func newTransport(cfg Options) *http.Transport {
	return &http.Transport{
		Proxy:       nil, // instances are on the pod network; never an HTTP proxy
		DialContext: instanceDialer(cfg, nil).DialContext,
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

// instanceDialer dials instances: control sets socket options (the BPF
// skip mark) when not nil.
func instanceDialer(cfg Options, control func(network, address string, c syscall.RawConn) error) *net.Dialer {
	return &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second, Control: control}
}

func newNethttpForwarder(cfg Options, p *Proxy) *nethttpForwarder {
	f := &nethttpForwarder{p: p, transport: newTransport(cfg)}
	f.rp = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      checkedTransport{f.transport},
		BufferPool:     bufferPool{},
		ErrorLog:       slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
		ErrorHandler:   recordError,
		ModifyResponse: recordStatus,
		// FlushInterval 0: ReverseProxy already flushes each read at once
		// for responses without a Content-Length (chunked streams) and for
		// text/event-stream; a fixed-length response is written whole.
	}
	return f
}

// ServeHTTP is the net/http server's handler.
func (f *nethttpForwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := checkConnection(r.Header); err != nil {
		// As the h1 server refuses it (h1.ErrBadConnection): net/http
		// would forward it with its framing, but the forwarders agree.
		ans := badConnectionAnswer(err)
		w.Header().Set("Connection", "close")
		ans.write(w, f.p.count(nil, ans, route.Ref{}))
		return
	}
	if r.ProtoMajor == 1 && r.ProtoMinor == 0 {
		w = http10Writer{w}
	}
	x := &httpExchange{f: f, w: w, r: r}
	defer x.done()
	f.p.serve(x, &x.ls)
	if x.abort {
		// The exchange broke after the response's header; it is counted.
		// net/http drops the caller's connection.
		panic(http.ErrAbortHandler)
	}
}

// http10Writer keeps an instance's 1xx answers from an HTTP/1.0 caller
// (RFC 9110 §15.2), which would take one for the final answer: the
// ReverseProxy relays them, and net/http's server writes them whatever
// the caller's version. Unwrap lets http.ResponseController reach the
// connection (Flush, Hijack for an upgrade).
type http10Writer struct{ http.ResponseWriter }

func (w http10Writer) WriteHeader(code int) {
	if code >= 100 && code < 200 {
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w http10Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// httpExchange is a request net/http read.
type httpExchange struct {
	f *nethttpForwarder
	w http.ResponseWriter
	r *http.Request

	out    *http.Request // r with the attempt in its context, built at the first send
	sctx   context.Context
	cancel context.CancelFunc
	body   *trackedBody
	at     attempt
	abort  bool
	// account is X-Skipper-Caller's value ("": not sent).
	account string
	ls      lease
}

// attempt is one send of a request, reached from the ReverseProxy hooks
// through the outgoing request's context.
type attempt struct {
	instance *route.Instance
	account  string // X-Skipper-Caller ("": not sent)
	status   int
	err      error
}

// checkConnection is h1's rule on Connection fields for a head net/http
// read (h1.ErrBadConnection).
func checkConnection(h http.Header) error {
	for _, v := range h["Connection"] {
		if h1.BadConnection([]byte(v)) {
			return fmt.Errorf("%w: Connection %q", h1.ErrBadConnection, v)
		}
	}
	return nil
}

// dropReserved deletes a trailer's X-Skipper-* fields (as h1.Body does):
// the router's own fields never come from a peer's trailers.
func dropReserved(t http.Header) {
	for k := range t {
		if len(k) >= len(h1.ReservedPrefix) && strings.EqualFold(k[:len(h1.ReservedPrefix)], h1.ReservedPrefix) {
			delete(t, k)
		}
	}
}

// trailerFilter drops a response's X-Skipper-* trailers once the
// transport has read them, at the body's end.
type trailerFilter struct {
	io.ReadCloser
	res *http.Response
}

func (t trailerFilter) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if err == io.EOF {
		dropReserved(t.res.Trailer)
	}
	return n, err
}

type attemptKey struct{}

func attemptOf(r *http.Request) *attempt { return r.Context().Value(attemptKey{}).(*attempt) }

func (x *httpExchange) functionHeader() string   { return x.r.Header.Get(HeaderFunction) }
func (x *httpExchange) host() string             { return x.r.Host }
func (x *httpExchange) setCaller(account string) { x.account = account }
func (x *httpExchange) callerAddr() netip.Addr {
	ap, err := netip.ParseAddrPort(x.r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
func (x *httpExchange) method() string       { return x.r.Method }
func (x *httpExchange) idempotencyKey() bool { return x.r.Header.Get(HeaderIdempotencyKey) != "" }
func (x *httpExchange) contentLength() int64 { return x.r.ContentLength }
func (x *httpExchange) ctx() context.Context { return x.r.Context() }
func (x *httpExchange) gone() bool           { return x.r.Context().Err() != nil }
func (x *httpExchange) bodyStarted() bool    { return x.body.started() }
func (x *httpExchange) handed() *lease       { return nil }
func (x *httpExchange) answer(a answer, fn string) {
	a.write(x.w, fn)
}

func (x *httpExchange) done() {
	if x.cancel != nil {
		x.cancel()
	}
}

// send sends with the transport, which keeps its own connections: fresh
// has nothing to choose, and no send reports reused (the transport sends
// again itself on a connection found closed).
func (x *httpExchange) send(in *route.Instance, deadline time.Time, _ bool) (res result) {
	if x.out == nil {
		x.sctx = context.WithValue(x.r.Context(), attemptKey{}, &x.at)
		if !deadline.IsZero() {
			x.sctx, x.cancel = context.WithDeadline(x.sctx, deadline)
		}
		x.out = x.r.WithContext(x.sctx)
		if r := x.r; r.Body != nil && r.Body != http.NoBody {
			rc := r.Body
			if max := x.ls.maxBody; max > 0 && r.ContentLength < 0 {
				// The transport returns the *http.MaxBytesError of the read
				// that crosses the limit (a 413), and the server closes the
				// caller's connection after the answer.
				rc = http.MaxBytesReader(x.w, rc, max)
			}
			x.body = &trackedBody{rc: rc, framed: r.ProtoMajor == 1}
			x.out.Body = x.body
		}
	}
	x.at = attempt{instance: in, account: x.account}
	defer func() {
		// An exchange that breaks after the response's header (the caller
		// went away, the instance died mid-body) aborts the copy with
		// http.ErrAbortHandler: stop it here so that the core counts it
		// and gives the instance back; ServeHTTP panics again after.
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			x.abort = true
			code := http.StatusBadGateway
			switch {
			case x.r.Context().Err() != nil:
				code = StatusClientClosed
			case x.sctx.Err() != nil:
				code = http.StatusGatewayTimeout
			}
			res = result{status: x.at.status, aborted: code}
		}
	}()
	x.f.rp.ServeHTTP(x.w, x.out)
	return result{status: x.at.status, err: x.at.err}
}

func rewrite(pr *httputil.ProxyRequest) {
	a := attemptOf(pr.Out)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = a.instance.Address
	pr.Out.Host = pr.In.Host // the instance sees the Host the caller used
	pr.Out.Header.Del(HeaderFunction)
	pr.Out.Header.Del(HeaderCaller)
	dropReserved(pr.Out.Trailer)
	if a.account != "" {
		pr.Out.Header[HeaderCaller] = []string{a.account}
	}
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

// recordError keeps a transport error for the core to handle (retry or
// answer) instead of answering 502 at once.
func recordError(_ http.ResponseWriter, r *http.Request, err error) { attemptOf(r).err = err }

func recordStatus(res *http.Response) error {
	attemptOf(res.Request).status = res.StatusCode
	return nil
}

// checkedTransport holds the instance's answers to h1's rules before the
// ReverseProxy, which drops the fields Connection names, sees them. An
// answer whose Connection field names its framing is an error (a 502, as
// under h1). Its body is closed unread, which closes the connection; one
// without a body went back to the transport's pool as it was read. That
// is safe here, unlike under h1: the transport frames an answer by its
// own parse whatever Connection names, so nothing of it is left unread,
// and it drops a connection on which bytes arrive unasked. A chunked
// answer's X-Skipper-* trailers are dropped at its end.
type checkedTransport struct{ *http.Transport }

func (t checkedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := t.Transport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if err := checkConnection(res.Header); err != nil {
		_ = res.Body.Close()
		return nil, fmt.Errorf("instance answer: %w", err)
	}
	dropReserved(res.Trailer)
	if len(res.TransferEncoding) > 0 && res.StatusCode != http.StatusSwitchingProtocols {
		res.Body = trailerFilter{ReadCloser: res.Body, res: res}
	}
	return res, nil
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
	// framed: an HTTP/1 body, whose own framing errors are errBadBody.
	framed bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	n, err := b.rc.Read(p)
	if b.framed && malformedBody(err) {
		err = fmt.Errorf("%w: %w", errBadBody, err)
	}
	return n, err
}

// malformedBody reports a read error of net/http's HTTP/1 server that is
// the body's own (its chunked coding broken), not the caller gone (a cut
// body, a network error) nor the limit (*http.MaxBytesError). HTTP/2's
// DATA frames have no such coding: its read errors are the stream's.
// net/http reports a caller gone inside the trailers with an error of its
// own, which has no sentinel: "http: unexpected EOF reading trailer".
func malformedBody(err error) bool {
	var ne net.Error
	var tooLarge *http.MaxBytesError
	return err != nil && err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &ne) &&
		!errors.As(err, &tooLarge) && !errors.Is(err, context.Canceled) && !errors.Is(err, http.ErrBodyReadAfterClose) &&
		!strings.Contains(err.Error(), "unexpected EOF")
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
