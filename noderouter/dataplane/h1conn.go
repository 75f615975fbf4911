package dataplane

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"skipper.dev/skipper/noderouter/h1"
	"skipper.dev/skipper/noderouter/route"
)

// watchAfter is how long a request waits for its response head before its
// caller's connection is watched for the caller going away (a read in a
// goroutine of its own): fast requests never pay for the watch.
const watchAfter = 50 * time.Millisecond

// h1conn is one caller connection served by the h1 forwarder; it is the
// exchange of each request read from it in turn.
type h1conn struct {
	s  *h1Server
	p  *Proxy
	nc net.Conn
	// rw is nc as br and bw read and write it: raw socket calls (sock)
	// when nc is TCP.
	rw net.Conn
	br *bufio.Reader
	bw *bufio.Writer
	// forIP is the caller's address as X-Forwarded-For and Forwarded
	// name it.
	forIP, forwardedFor string
	// ip is the caller's address, which tells who it is (spec.callers);
	// account is who, for X-Skipper-Caller ("": not sent), per request.
	ip      netip.Addr
	account string

	idle atomic.Bool // waiting for a request (Shutdown closes it then)
	// waitDeadline: the read deadline of the wait for a request head is
	// still on (see setWaitDeadline).
	waitDeadline atomic.Bool

	// The request being served.
	req     h1.Request
	body    h1.Body // the request's
	resp    h1.Response
	rbody   h1.Body    // the response's
	add     []h1.Field // added to the request head
	resAdd  []h1.Field // added to the response head
	scratch []byte
	lenBuf  []byte // the response's Content-Length value
	// sent: request body bytes went upstream; bodyDone: the request body
	// was read to its end; closeAfter: the connection ends after this
	// exchange.
	sent, bodyDone, closeAfter bool
	// rewritten: the head's fields were marked and add filled (a second
	// send of the request writes the same head).
	rewritten bool
	// flushLater: the answer is written but not flushed (serve flushes it
	// once the core is done).
	flushLater bool

	// The watch of the caller while a request waits (startWatch).
	watch    *time.Timer            // starts watchCaller after watchAfter
	watching atomic.Bool            // a watch is armed or runs
	watchEnd chan struct{}          // one value when a watch's read returned
	watchMu  sync.Mutex             // orders a watch's deadline clear and stopWatch's
	stopping bool                   // stopWatch set its deadline (under watchMu)
	left     atomic.Bool            // the caller went away
	up       atomic.Pointer[upConn] // the send's connection, closed when the caller left
	rctx     context.Context        // ctx's, made on demand
	cancel   context.CancelFunc

	// Set when an event loop hands the connection over (loophandoff.go):
	// prefix holds bytes it read from nc, read first; continued, it served
	// requests on nc before (no h2c preface to look for); resume, an
	// exchange it started, finished first; prior, the first request's
	// lease, which the loop admitted and sent once, and whose send failed
	// before any response.
	prefix    []byte
	continued bool
	resume    *resumed
	prior     *lease

	// ls is the lease of the request being served.
	ls lease
}

func newH1conn(s *h1Server, nc net.Conn) *h1conn {
	c := &h1conn{s: s, p: s.p, nc: nc, watchEnd: make(chan struct{}, 1)}
	c.rw, _ = newSock(nc, false)
	host, _, err := net.SplitHostPort(nc.RemoteAddr().String())
	if err != nil {
		host = nc.RemoteAddr().String()
	}
	c.forIP = host
	c.forwardedFor = host
	if ap, err := netip.ParseAddrPort(nc.RemoteAddr().String()); err == nil {
		c.ip = ap.Addr().Unmap()
	}
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		c.forwardedFor = `"[` + host + `]"` // IPv6 is quoted and bracketed
	}
	c.watch = time.AfterFunc(time.Hour, c.watchCaller)
	c.watch.Stop()
	return c
}

// readers and writers are the caller connections' buffers, reused from
// closed connections.
var (
	readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 16<<10) }}
)

// serve reads and forwards requests until the connection ends.
func (c *h1conn) serve() {
	defer c.s.done(c)
	c.br = readers.Get().(*bufio.Reader)
	// A request an event loop read is served even while the server shuts
	// down (it is answered with Connection: close).
	handed := len(c.prefix) > 0
	if handed {
		c.br.Reset(&prefixReader{p: c.prefix, r: c.rw})
		c.prefix = nil
	} else {
		c.br.Reset(c.rw)
	}
	c.bw = writers.Get().(*bufio.Writer)
	c.bw.Reset(c.rw)
	handedOff := false
	defer func() {
		c.watch.Stop()
		if !handedOff {
			_ = c.nc.Close()
			c.br.Reset(nil)
			readers.Put(c.br)
		}
		c.bw.Reset(nil)
		writers.Put(c.bw)
	}()
	if r := c.resume; r != nil {
		c.resume = nil
		c.finishResumed(r)
		if c.closeAfter || c.s.shutdown.Load() {
			if !c.bodyDone {
				c.lingerClose()
			}
			return
		}
	}
	for first := !c.continued; ; first, handed = false, false {
		c.idle.Store(!handed)
		if c.s.shutdown.Load() && !handed {
			return
		}
		if c.br.Buffered() == 0 && !handed {
			c.setWaitDeadline(idleTimeout)
			if c.s.shutdown.Load() {
				return // Shutdown's wake-up may have come before this deadline
			}
			if _, err := c.br.Peek(1); err != nil {
				return // closed, idle too long, or woken by Shutdown
			}
		}
		c.idle.Store(false)
		if first || !h1.HeadBuffered(c.br) {
			// A head not all read yet gets headerTimeout from its first
			// byte; one already buffered (a warm caller's, as a rule) is
			// parsed without a read.
			c.setWaitDeadline(headerTimeout)
		}
		if first {
			h2, err := isH2(c.br)
			if err != nil {
				return
			}
			if h2 {
				c.clearWaitDeadline()
				handedOff = c.s.handoff.hand(&peekedConn{Conn: c.nc, r: c.br})
				return
			}
		}
		if err := c.req.Read(c.br, c.p.maxHeaderBytes); err != nil {
			c.refuse(err)
			return
		}
		c.startRequest()
		c.p.serve(c, &c.ls)
		c.endRequest()
		if c.flushLater {
			// After the core gave the instance back (see relay).
			c.flushLater = false
			if err := c.bw.Flush(); err != nil {
				c.closeAfter = true
			}
		}
		if c.closeAfter || c.s.shutdown.Load() {
			if !c.bodyDone {
				c.lingerClose()
			}
			return
		}
	}
}

// setWaitDeadline bounds the wait for a request head by d from now. The
// deadline is left in place once the head is read (each set or clear is a
// timer change of the runtime's, on every request): clearWaitDeadline
// takes it off before anything of the request reads the caller's
// connection (a body, the watch, a tunnel), and a warm GET reads nothing.
func (c *h1conn) setWaitDeadline(d time.Duration) {
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	c.waitDeadline.Store(true)
}

// clearWaitDeadline takes off the deadline of the wait for the head, if
// it is still on.
func (c *h1conn) clearWaitDeadline() {
	if c.waitDeadline.Swap(false) {
		_ = c.nc.SetReadDeadline(time.Time{})
	}
}

// wakeIfIdle ends the wait for the next request of an idle connection
// (Shutdown).
func (c *h1conn) wakeIfIdle() {
	if c.idle.Load() {
		_ = c.nc.SetReadDeadline(time.Now())
		// A pipelined request already buffered is served without a read:
		// its body read and its watch take this deadline off first.
		c.waitDeadline.Store(true)
	}
}

// refuse answers a request head that cannot be read as net/http's server
// does (plain text, then close); a timeout or a closed connection gets no
// answer.
func (c *h1conn) refuse(err error) {
	var ne net.Error
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) {
		return
	}
	if errors.Is(err, h1.ErrBadConnection) {
		// A refusal that matters to whoever runs the router: answered and
		// counted as the core's own answers are.
		ans := badConnectionAnswer(err)
		// The head was read up to its fields: its method is known.
		writeAnswer(c.bw, ans, c.p.count(nil, ans, route.Ref{}), true, c.req.IsHEAD())
		_ = c.bw.Flush()
		c.s.log.Debug("request refused", "remote", c.forIP, "reason", ans.reason, "err", err)
		c.lingerClose()
		return
	}
	code := h1.Status(err)
	text := strconv.Itoa(code) + " " + http.StatusText(code)
	c.bw.WriteString("HTTP/1.1 " + text + "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n")
	if !c.req.IsHEAD() {
		// A head read as far as its method may be a HEAD's: no body then
		// (found by FuzzRouterSplit).
		c.bw.WriteString(text)
	}
	_ = c.bw.Flush()
	c.s.log.Debug("bad request head", "remote", c.forIP, "status", code, "err", err)
	c.lingerClose()
}

// lingerTimeout bounds lingerClose (net/http's server waits as long).
const lingerTimeout = 500 * time.Millisecond

// lingerClose half-closes the connection and reads what the caller still
// sends for a while, so that closing with unread bytes (a head or body cut
// short by an answer) does not reset the connection before the caller read
// the answer.
func (c *h1conn) lingerClose() {
	if tc, ok := c.nc.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(lingerTimeout))
	_, _ = io.Copy(io.Discard, c.nc)
}

// startRequest resets the per-request state after a head was read.
func (c *h1conn) startRequest() {
	c.sent, c.bodyDone, c.closeAfter = false, c.req.Framing().Kind == h1.BodyNone, !c.req.KeepAlive()
	c.add, c.rewritten, c.account = c.add[:0], false, ""
	c.left.Store(false)
}

// endRequest stops what the request started.
func (c *h1conn) endRequest() {
	c.stopWatch()
	if c.cancel != nil {
		c.cancel()
		c.rctx, c.cancel = nil, nil
	}
	if !c.bodyDone {
		// The body was not read (an answer of the router's own, a failed
		// send): the connection cannot carry another request.
		c.closeAfter = true
	}
}

func (c *h1conn) functionHeader() string {
	if v, ok := c.req.Get(HeaderFunction); ok {
		return string(v)
	}
	return ""
}

func (c *h1conn) host() string             { return string(c.req.Host()) }
func (c *h1conn) callerAddr() netip.Addr   { return c.ip }
func (c *h1conn) setCaller(account string) { c.account = account }
func (c *h1conn) method() string           { return string(c.req.Method()) }
func (c *h1conn) idempotencyKey() bool     { _, ok := c.req.Get(HeaderIdempotencyKey); return ok }
func (c *h1conn) bodyStarted() bool        { return c.sent }

// handed hands the loop's lease to the first request only.
func (c *h1conn) handed() *lease {
	l := c.prior
	c.prior = nil
	return l
}
func (c *h1conn) gone() bool { return c.left.Load() }

func (c *h1conn) contentLength() int64 {
	switch f := c.req.Framing(); f.Kind {
	case h1.BodyLength:
		return f.Length
	case h1.BodyChunked:
		return -1
	}
	return 0
}

// ctx is a context that ends when the caller goes away: the caller's
// connection is watched from now until the next send or the end of the
// request.
func (c *h1conn) ctx() context.Context {
	if c.rctx == nil {
		c.stopWatch() // the watch reads cancel
		c.rctx, c.cancel = context.WithCancel(context.Background())
	}
	c.startWatch(0)
	if c.left.Load() {
		c.cancel()
	}
	return c.rctx
}

// answer writes the router's own answer (JSON, as nethttp's).
func (c *h1conn) answer(a answer, fn string) {
	if a.status == StatusClientClosed {
		c.closeAfter = true
		return
	}
	c.stopWatch()
	if !c.bodyDone {
		c.closeAfter = true
	}
	writeAnswer(c.bw, a, fn, c.closeAfter || c.s.shutdown.Load(), c.req.IsHEAD())
	if err := c.bw.Flush(); err != nil {
		c.closeAfter = true
	}
}

// writeAnswer writes the router's own answer a (JSON) to w, with
// Connection: close when closeConn; to a HEAD request (head) without its
// body, which the caller would read as the next answer (RFC 9110 §9.3.2;
// found by FuzzRouterSplit).
func writeAnswer(w *bufio.Writer, a answer, fn string, closeConn, head bool) {
	b := a.body(fn)
	w.WriteString("HTTP/1.1 ")
	w.WriteString(strconv.Itoa(a.status))
	w.WriteByte(' ')
	w.WriteString(http.StatusText(a.status))
	w.WriteString("\r\nContent-Type: application/json\r\nContent-Length: ")
	w.WriteString(strconv.Itoa(len(b)))
	if a.retryAfter {
		w.WriteString("\r\nRetry-After: " + retryAfter)
	}
	if closeConn {
		w.WriteString("\r\nConnection: close")
	}
	w.WriteString("\r\n\r\n")
	if !head {
		w.Write(b)
	}
}

// startWatch watches the caller's connection for its going away after d
// (0: now), while the request waits. Only one watch runs at a time.
func (c *h1conn) startWatch(d time.Duration) {
	if c.watching.Load() {
		return
	}
	c.watching.Store(true)
	if d == 0 {
		go c.watchCaller()
		return
	}
	c.watch.Reset(d)
}

// watchCaller reads the caller's connection: an error other than the
// stop's deadline means the caller went away (then the send in progress is
// broken off by closing its upstream connection); bytes (a pipelined
// request) stay buffered and end the watch.
func (c *h1conn) watchCaller() {
	// The head's deadline comes off first, unless stopWatch already set
	// its own (a clear after it would leave the read below unbounded).
	c.watchMu.Lock()
	if c.stopping {
		c.watchMu.Unlock()
		c.watchEnd <- struct{}{}
		return
	}
	c.clearWaitDeadline()
	c.watchMu.Unlock()
	_, err := c.br.Peek(1)
	if err != nil && !isTimeout(err) {
		c.left.Store(true)
		if c.cancel != nil {
			c.cancel()
		}
		if up := c.up.Load(); up != nil {
			up.abort()
		}
	}
	c.watchEnd <- struct{}{}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// stopWatch ends the watch, waiting for its read to return.
func (c *h1conn) stopWatch() {
	if !c.watching.Load() {
		return
	}
	if c.watch.Stop() {
		// It had not fired.
		c.watching.Store(false)
		return
	}
	c.watchMu.Lock()
	c.stopping = true
	_ = c.nc.SetReadDeadline(time.Now())
	c.watchMu.Unlock()
	<-c.watchEnd
	_ = c.nc.SetReadDeadline(time.Time{})
	c.waitDeadline.Store(false)
	c.stopping = false
	c.watching.Store(false)
}
