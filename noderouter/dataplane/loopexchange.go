package dataplane

import (
	"bytes"
	"context"
	"io"
	"time"

	"skipper.dev/skipper/noderouter/h1"
)

// lexchange is the request an event loop's caller connection waits on
// (busy), from its head to its answer.
type lexchange struct {
	busy      bool // ls holds an admitted request
	hlen      int  // the head's bytes at the front of the caller's in
	head      bool
	minor     byte
	keepAlive bool
	leftAt    time.Time // the caller shut its side down (zero: not)
	ls        lease
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
)

var handoverReasons = []string{handoverRequest, handoverCold, handoverBusy, handoverSplit, handoverRetry, handoverAnswer}

// fromCaller reads and serves c's requests, one at a time, until one
// waits on an instance, nothing more is there, or c is handed over.
func (l *evloop) fromCaller(c *lconn) {
	for l.conn(c.fd) == c && !c.x.busy && len(c.out) == 0 {
		if c.closeAfter {
			l.close(c)
			return
		}
		if c.served == 0 && c.n > 0 && h1.IsH2Preface(c.in[:min(c.n, h1.H2PrefaceLen)]) {
			l.handOver(c, handoverRequest, nil) // h2c: net/http's, through the goroutine path
			return
		}
		if end := headEnd(c.in[:c.n]); end >= 0 {
			l.begin(c, end)
			continue
		}
		if c.n == len(c.in) {
			l.handOver(c, handoverRequest, nil) // a head larger than the loop's buffer
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
			l.handOver(c, handoverSplit, nil)
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

// begin serves the request whose head is c.in[:hlen] if it is warm: the
// pipeline admits it without waiting, or answers it; it hands c over
// otherwise.
func (l *evloop) begin(c *lconn, hlen int) {
	p := l.p
	start := time.Now()
	r := &l.req
	l.rd.Reset(c.in[:hlen])
	l.br.Reset(&l.rd)
	if err := r.Read(l.br, p.maxHeaderBytes); err != nil || l.br.Buffered() > 0 || !loopable(r) {
		l.handOver(c, handoverRequest, nil) // refused or served there, as it always was
		return
	}
	q := request{from: c.ip, start: start, idempotent: true}
	if v, ok := r.Get(HeaderFunction); ok {
		q.fh = string(v)
	}
	if q.fh == "" {
		q.host = string(r.Host()) // the name's other place, and a string only then
	}
	x := &c.x
	x.hlen, x.head, x.minor, x.keepAlive, x.leftAt = hlen, r.IsHEAD(), r.Minor(), r.KeepAlive(), time.Time{}
	if !x.keepAlive {
		c.closeAfter = true
	}
	v := p.admit(&x.ls, q, nil)
	switch {
	case v.wait != "":
		l.handOver(c, v.wait, nil) // it waits there
		return
	case v.lease == nil:
		l.reply(c, v.ans, v.fn)
		return
	}
	x.busy = true
	if !x.ls.deadline.IsZero() {
		l.sweepBy(x.ls.deadline) // a short function timeout is kept to the millisecond
	}
	l.send(c, start, false)
}

// send writes c's request, parsed in l.req, to its instance: on the
// connection used last, or on a new one when fresh.
func (l *evloop) send(c *lconn, now time.Time, fresh bool) {
	ls := &c.x.ls
	addr := ls.in.Address
	if !fresh {
		ls.sends++ // before the dial, as forward counts: a failed dial is a send
	}
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
	l.scratch, l.fields = forwardFields(&l.req, c.forIP, c.forwardedFor, ls.account, l.scratch, l.fields)
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
	ls.sent = now
	up.ready = false // the answer cannot be there yet: wait for its edge
}

// failed handles a send of c's request that failed before any response,
// as the pipeline's next decides for every transport: sent again at once
// on a new connection (a kept-alive one the instance had closed), or
// handed with its lease to the goroutine path, which sends it elsewhere
// after the backoff, or answered here.
func (l *evloop) failed(c *lconn, err error, reused bool) {
	ls := &c.x.ls
	switch ls.failedSend(err, false, reused, false) {
	case moveFresh:
		l.rd.Reset(c.in[:c.x.hlen])
		l.br.Reset(&l.rd)
		if l.req.Read(l.br, l.p.maxHeaderBytes) == nil { // it was read before: it cannot fail
			l.send(c, time.Now(), true)
			return
		}
		l.fail(c, err)
	case moveElsewhere:
		handed := new(lease)
		*handed = *ls
		c.x.busy = false
		l.handOver(c, handoverRetry, handed)
	default:
		l.fail(c, err)
	}
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
	ls := &c.x.ls
	c.x.busy = false
	ls.upstream += now.Sub(ls.sent)
	ls.done(outcome{status: status, end: now})
	l.p.m.loopServed.Inc()
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
	c.x.busy = false
	l.reply(c, ans, c.x.ls.done(outcome{ans: ans}))
}

// reply writes the router's own answer ans to c's request (fn names the
// function) and goes on with its next request; a caller gone (499) gets
// none: c is closed.
func (l *evloop) reply(c *lconn, ans answer, fn string) {
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
