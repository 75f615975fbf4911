package noderouter

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"time"

	"skipper.dev/skipper/noderouter/h1"
	"skipper.dev/skipper/noderouter/route"
)

// lexchange is the request an event loop's caller connection waits on
// (busy), from its head to its answer: parse → pick → forward → finish,
// as proxy.serve, for the warm case only (see evloop).
type lexchange struct {
	busy      bool
	hlen      int // the head's bytes at the front of the caller's in
	head      bool
	minor     byte
	counted   bool // in proxy.inFlight (--max-in-flight)
	ref       route.Ref
	e         *route.Entry
	in        *route.Instance // its slot held while busy
	start     time.Time       // the head was read
	sent      time.Time       // the request went out
	deadline  time.Time       // zero: none
	keepAlive bool
	fresh     bool      // sent again on a new connection (failed)
	leftAt    time.Time // the caller shut its side down (zero: not)
	account   string    // X-Skipper-Caller ("": not sent)
}

// headEnd is the length of the message head at the front of b: through
// the first empty line, which ends in LF or CRLF as h1 reads lines; -1
// when b holds no whole head.
func headEnd(b []byte) int {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		i += j + 1
		switch {
		case i < len(b) && b[i] == '\n':
			return i + 1
		case i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n':
			return i + 2
		}
	}
}

// Why an event loop handed a connection over (loop_handovers_total).
const (
	handoverRequest = "request"
	handoverCold    = "cold"
	handoverBusy    = "busy"
	handoverSplit   = "split"
	handoverRetry   = "retry"
	handoverAnswer  = "answer"
	handoverCaller  = "caller"
)

var handoverReasons = []string{handoverRequest, handoverCold, handoverBusy, handoverSplit, handoverRetry, handoverAnswer, handoverCaller}

// fromCaller reads and serves c's requests, one at a time, until one
// waits on an instance, nothing more is there, or c is handed over.
func (l *evloop) fromCaller(c *lconn) {
	for l.conn(c.fd) == c && !c.x.busy && len(c.out) == 0 {
		if c.closeAfter {
			l.close(c)
			return
		}
		if c.served == 0 && c.n > 0 && h1.IsH2Preface(c.in[:min(c.n, h1.H2PrefaceLen)]) {
			l.handOver(c, handoverRequest) // h2c: net/http's, through the goroutine path
			return
		}
		if end := headEnd(c.in[:c.n]); end >= 0 {
			l.begin(c, end)
			continue
		}
		if c.n == len(c.in) {
			l.handOver(c, handoverRequest) // a head larger than the loop's buffer
			return
		}
		switch l.fill(c) {
		case readSome:
			continue
		case readEnd:
			l.close(c)
			return
		}
		switch {
		case c.n > 0:
			// A head cut across reads: the goroutine path waits for the
			// rest (within the header timeout) and serves the request.
			l.handOver(c, handoverSplit)
		case c.rdhup:
			l.close(c) // the caller is done sending and all it sent is answered
		}
		return
	}
}

// loopable reports a request the loop may serve: a GET or HEAD without a
// body, upgrade or Expect.
func loopable(r *h1.Request) bool {
	m := r.Method()
	return (string(m) == "GET" || string(m) == "HEAD") && r.Framing().Kind == h1.BodyNone &&
		r.Upgrade() == nil && !r.ExpectContinue()
}

// begin serves the request whose head is c.in[:hlen] if it is warm, and
// hands c over otherwise.
func (l *evloop) begin(c *lconn, hlen int) {
	p := l.p
	start := time.Now()
	r := &l.req
	l.rd.Reset(c.in[:hlen])
	l.br.Reset(&l.rd)
	if err := r.Read(l.br, p.maxHeaderBytes); err != nil || l.br.Buffered() > 0 || !loopable(r) {
		l.handOver(c, handoverRequest) // refused or served there, as it always was
		return
	}
	fh := ""
	if v, ok := r.Get(HeaderFunction); ok {
		fh = string(v)
	}
	host := ""
	if fh == "" {
		host = string(r.Host()) // the name's other place, and a string only then
	}
	ref, err := p.parseName(fh, host)
	if err != nil {
		l.handOver(c, handoverRequest)
		return
	}
	e, a := p.cache.Lookup(ref)
	if a == nil || a.Config.Oneshot || len(a.Instances) == 0 {
		l.handOver(c, handoverCold) // cold, or oneshot: GetInstance
		return
	}
	account := ""
	if pol := a.Config.Callers; pol != nil {
		id, ok := p.identify(c.ip)
		if !ok || !pol.Allows(id) {
			l.handOver(c, handoverCaller) // refused there, with its answer and count
			return
		}
		account = id.Account
	}
	counted := p.maxInFlight > 0
	if counted && p.inFlight.Add(1) > p.maxInFlight {
		p.inFlight.Add(-1)
		l.handOver(c, handoverBusy) // answered there
		return
	}
	in := a.Acquire(rand.Uint64(), a.Config.ConcurrencyLimit, nil)
	if in == nil {
		if counted {
			p.inFlight.Add(-1)
		}
		l.handOver(c, handoverBusy) // queued there
		return
	}
	p.m.cacheHit.Inc()
	e.InFlight.Add(1)
	in.Requests.Add(1)
	timeout := p.requestTimeout
	if a.Config.Timeout > 0 {
		timeout = a.Config.Timeout
	}
	c.x = lexchange{busy: true, hlen: hlen, head: r.IsHEAD(), minor: r.Minor(), counted: counted,
		ref: ref, e: e, in: in, start: start, keepAlive: r.KeepAlive(), account: account}
	if timeout > 0 {
		c.x.deadline = start.Add(timeout)
		l.sweepBy(c.x.deadline) // a short function timeout is kept to the millisecond
	}
	if !c.x.keepAlive {
		c.closeAfter = true
	}
	l.send(c, start, false)
}

// send writes c's request, parsed in l.req, to its instance: on the
// connection used last, or on a new one when fresh.
func (l *evloop) send(c *lconn, now time.Time, fresh bool) {
	addr := c.x.in.Address
	var up *lconn
	var err error
	if fresh {
		up, err = l.dial(addr, now)
	} else {
		up, err = l.upstream(addr, now)
	}
	if err != nil {
		l.failed(c, err, false)
		return
	}
	l.scratch, l.fields = forwardFields(&l.req, c.forIP, c.forwardedFor, c.x.account, l.scratch, l.fields)
	l.fdw.c = up
	err = h1.WriteRequest(l.bw, &l.req, l.fields)
	if err == nil {
		err = l.bw.Flush()
	}
	if err != nil {
		l.bw.Reset(&l.fdw)
		l.close(up)
		l.failed(c, err, up.reused)
		return
	}
	c.peer, up.peer = up, c
	c.x.sent = now
	up.ready = false // the answer cannot be there yet: wait for its edge
}

// failed handles a send of c's request that failed before any response,
// as h1conn.send and the forward loop do: a kept-alive connection the
// instance closed as it was reused is replaced by a new one once; a
// failed connect evicts the instance; then the goroutine path sends the
// request again (elsewhere, after the backoff) if --max-attempts allows,
// and the loop answers otherwise. A GET or HEAD may always be sent again.
func (l *evloop) failed(c *lconn, err error, reused bool) {
	if reused && !c.x.fresh && retryFresh(err) {
		c.x.fresh = true
		l.rd.Reset(c.in[:c.x.hlen])
		l.br.Reset(&l.rd)
		if l.req.Read(l.br, l.p.maxHeaderBytes) == nil {
			l.send(c, time.Now(), true)
			return
		}
	}
	l.evict(c, err)
	if l.p.maxAttempts <= 1 || !retryable(classify(err, false), true, false) {
		l.fail(c, err)
		return
	}
	x := c.x
	l.endSlot(c)
	l.handOver(c, handoverRetry, &priorSend{in: x.in, err: err, start: x.start})
}

// fromInstance reads the answer to the request up carries and relays it
// once it is all there.
func (l *evloop) fromInstance(up *lconn) {
	for l.conn(up.fd) == up {
		c := up.peer
		if c == nil {
			if up.ready {
				l.close(up) // idle and readable: the instance closed it, or sent stray bytes
			}
			return
		}
		end := headEnd(up.in[:up.n])
		if end >= 0 {
			if l.answer(c, up, end) {
				return
			}
		} else if up.n == len(up.in) {
			l.resume(c, up) // a head larger than the loop's buffer
			return
		}
		switch l.fill(up) {
		case readSome:
			continue
		case readEnd:
			if end >= 0 {
				// The body broke off after a whole head: 502, as the
				// goroutine path's abort (nothing went to the caller yet).
				c.peer, up.peer = nil, nil
				l.close(up)
				l.fail(c, io.ErrUnexpectedEOF)
				return
			}
			// Before any answer: sent again (failed).
			err := io.ErrUnexpectedEOF
			if up.n == 0 {
				err = io.EOF
			}
			l.instanceFailed(up, err)
		}
		return
	}
}

// answer relays the answer whose head is up.in[:hlen] to c, or hands
// both over when it is not a warm one; false: more of its body is to come
// (and fits the buffer).
func (l *evloop) answer(c *lconn, up *lconn, hlen int) bool {
	r := &l.resp
	l.rd.Reset(up.in[:hlen])
	l.br.Reset(&l.rd)
	if err := r.Read(l.br, l.p.maxHeaderBytes, c.x.head); err == nil && l.br.Buffered() > 0 {
		l.resume(c, up) // not where h1 ends the head: the goroutine path reads it as it always did
		return true
	} else if err != nil {
		// Malformed: 502, never resent (classify's failOther).
		c.peer, up.peer = nil, nil
		l.close(up)
		l.fail(c, err)
		return true
	}
	f := r.Framing()
	body := 0
	switch {
	case r.Informational() || r.SwitchingProtocols():
		l.resume(c, up)
		return true
	case f.Kind == h1.BodyNone:
	case f.Kind == h1.BodyLength && f.Length <= int64(up.n-hlen):
		body = int(f.Length)
	case f.Kind == h1.BodyLength && f.Length <= int64(len(up.in)-hlen):
		return false
	default:
		l.resume(c, up) // streamed by the goroutine path
		return true
	}
	now := time.Now()
	status := r.Status()
	r.DropHopByHop()
	if l.draining || l.s.shutdown.Load() {
		c.closeAfter = true
	}
	add := l.fields[:0]
	add, l.lenBuf = answerLength(r, f, add, l.lenBuf[:0])
	switch {
	case c.closeAfter:
		add = append(add, h1.Field{Name: "Connection", Value: closeToken})
	case c.x.minor == 0:
		add = append(add, h1.Field{Name: "Connection", Value: keepAlive})
	}
	l.fields = add
	total := hlen + body
	l.fdw.c = c
	_ = h1.WriteResponse(l.bw, r, add)
	_, _ = l.bw.Write(up.in[hlen:total])
	c.peer, up.peer = nil, nil
	if r.KeepAlive() && up.n == total && len(up.out) == 0 && !up.rdhup {
		l.putIdle(up, now)
	} else {
		l.close(up) // bytes after the answer: the instance broke framing
	}
	// The slot goes back before the answer goes out, so that the
	// caller's next request never finds it taken.
	x := c.x
	l.endSlot(c)
	p := l.p
	p.m.loopServed.Inc()
	p.served(forwarded{e: x.e, instance: x.in, res: result{status: status}, upstream: now.Sub(x.sent)}, x.start, now, 0)
	l.flushNext(c)
	return true
}

// flushNext writes what the loop's writer holds to c, the answer to its
// request, and goes on with the caller's next request.
func (l *evloop) flushNext(c *lconn) {
	if err := l.bw.Flush(); err != nil {
		l.bw.Reset(&l.fdw)
		l.close(c)
		return
	}
	c.n = copy(c.in, c.in[c.x.hlen:c.n])
	c.x.hlen = 0
	c.served++
	c.since = l.now
	l.fromCaller(c)
}

// endSlot gives back what begin took for c's exchange.
func (l *evloop) endSlot(c *lconn) {
	x := &c.x
	if !x.busy {
		return
	}
	x.busy = false
	l.p.release(x.ref, x.e, x.in, false)
	x.e.InFlight.Add(-1)
	if x.counted {
		l.p.inFlight.Add(-1)
	}
}

// fail ends c's exchange with the router's own answer for err (none when
// the caller went away: then c is closed), and goes on with its next
// request.
func (l *evloop) fail(c *lconn, err error) {
	switch err {
	case errCallerLeft:
		err = context.Canceled
	case errRequestTimeout:
		err = context.DeadlineExceeded
	}
	ans := upstreamAnswer(err)
	x := c.x
	l.endSlot(c)
	fn := l.p.count(x.e, ans, x.ref)
	if ans.status == StatusClientClosed {
		l.close(c)
		return
	}
	if l.draining || l.s.shutdown.Load() {
		c.closeAfter = true
	}
	l.fdw.c = c
	writeAnswer(l.bw, ans, fn, c.closeAfter, c.x.head)
	l.flushNext(c)
}

// abort ends c's exchange for err before its answer came (the caller
// left, the request timed out): the instance connection is closed.
func (l *evloop) abort(c *lconn, err error) {
	if up := c.peer; up != nil {
		c.peer, up.peer = nil, nil
		l.close(up)
	}
	l.fail(c, err)
}

// evict drops c's instance from the cache after a failed connect, as the
// forward loop does.
func (l *evloop) evict(c *lconn, err error) {
	if !isDialError(err) {
		return
	}
	x := &c.x
	if l.p.cache.Evict(x.ref, x.in.PodUID) {
		l.p.m.evictions.Inc()
		l.log.Info("instance unreachable; evicted", "function", x.e.Key, "pod", x.in.Pod, "address", x.in.Address, "err", err)
	}
}
