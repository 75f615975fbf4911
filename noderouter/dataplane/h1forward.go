package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"skipper.dev/skipper/noderouter/h1"
	"skipper.dev/skipper/noderouter/route"
)

// errUpgradeRefused is a 101 to a request that asked for no upgrade.
var errUpgradeRefused = errors.New("instance switched protocols without an Upgrade request")

// send forwards the request once to in, on a pooled connection or a new
// one (fresh), and relays the answer: head, body (streamed, each read
// flushed), trailers.
func (c *h1conn) send(in *route.Instance, deadline time.Time, fresh bool) result {
	c.stopWatch()
	if c.left.Load() {
		return result{err: context.Canceled}
	}
	var up *upConn
	var err error
	if fresh {
		up, err = c.dial(in.Address, deadline)
	} else {
		up, err = c.upstream(in.Address, deadline)
	}
	if err != nil {
		return result{err: err}
	}
	c.up.Store(up)
	defer c.up.Store(nil)
	if err := c.exchange(up); err != nil {
		_ = up.Close()
		return result{err: err, reused: up.reused}
	}
	return c.relay(up)
}

// upstream returns a connection to addr: the pool's, checked alive when it
// idled a while, or a new one.
func (c *h1conn) upstream(addr string, deadline time.Time) (*upConn, error) {
	now := time.Now()
	for {
		up := c.p.pool.get(addr, now)
		if up == nil {
			return c.dial(addr, deadline)
		}
		// The deadline first: alive's peek fails on an expired one (the
		// last request's, left on while the connection idled).
		up.setDeadline(deadline)
		if now.Sub(up.since) < time.Second || alive(up) {
			return up, nil
		}
		_ = up.Close()
	}
}

func (c *h1conn) dial(addr string, deadline time.Time) (*upConn, error) {
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	up, err := c.p.pool.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	up.setDeadline(deadline)
	return up, nil
}

// alive reports whether an idle connection is still open: no EOF, reset
// or stray bytes waiting on it (a non-blocking peek).
func alive(up *upConn) bool {
	sc, ok := up.Conn.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ok = false
	var b [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = n < 0 && errors.Is(err, syscall.EAGAIN)
		return true
	})
	return ok
}

// retryFresh reports an error of a reused connection that the instance
// closed while it idled: nothing of the response came.
func retryFresh(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// exchange writes the request to up and reads the response head (relaying
// 1xx responses), leaving the body to relay.
func (c *h1conn) exchange(up *upConn) error {
	c.rewriteRequest()
	if err := h1.WriteRequest(up.bw, &c.req, c.add); err != nil {
		return err
	}
	if !c.bodyDone {
		if err := c.sendBody(up); err != nil {
			return err
		}
	}
	if up.bw.Buffered() > 0 {
		up.d.deferNext() // the flush's write goes with the wait for the answer
	}
	if err := up.bw.Flush(); err != nil {
		return err
	}
	return c.awaitHead(up)
}

// awaitHead reads the response head from up, relaying 1xx responses to
// the caller as they come.
func (c *h1conn) awaitHead(up *upConn) error {
	c.startWatch(watchAfter)
	defer c.stopWatch()
	for {
		if err := c.resp.Read(up.br, c.p.maxHeaderBytes, c.req.IsHEAD()); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return context.DeadlineExceeded
			}
			return err
		}
		if !c.resp.Informational() {
			if c.resp.SwitchingProtocols() && c.req.Upgrade() == nil {
				return errUpgradeRefused
			}
			return nil
		}
		if c.req.Minor() == 0 {
			// Never to an HTTP/1.0 caller (RFC 9110 §15.2), which would
			// take it for the final answer.
			continue
		}
		// 100 Continue and the like go to the caller as they come.
		c.resp.DropHopByHop()
		c.resp.Drop("Content-Length") // never sent with a 1xx (RFC 9110 §8.6)
		c.stopWatch()
		if err := h1.WriteResponse(c.bw, &c.resp, nil); err == nil {
			err = c.bw.Flush()
		}
		c.startWatch(watchAfter)
	}
}

// rewriteRequest marks the fields not forwarded and collects the ones
// added: the framing, Host for an absolute-form target, the upgrade, and
// this hop in X-Forwarded-* and Forwarded.
func (c *h1conn) rewriteRequest() {
	if c.rewritten {
		return
	}
	c.rewritten = true
	c.scratch, c.add = forwardFields(&c.req, c.forIP, c.forwardedFor, c.account, c.scratch, c.add)
}

// forwardFields marks r's fields not forwarded and returns the fields to
// add (reusing add; their values in scratch, reused too) for a caller at
// forIP (forwardedFor as Forwarded names it) of ServiceAccount account
// ("": X-Skipper-Caller is not sent).
func forwardFields(r *h1.Request, forIP, forwardedFor, account string, scratch []byte, add []h1.Field) ([]byte, []h1.Field) {
	upgrade := r.Upgrade()
	r.DropHopByHop()
	r.Drop(HeaderFunction)
	r.Drop(HeaderCaller)
	if r.ExpectContinue() {
		// Answered here (100 before the body is read), not forwarded.
		r.Drop("Expect")
	}
	s := scratch[:0]
	// X-Forwarded-For: the caller's chain and this hop, in one field.
	xff := len(s)
	s = r.AppendValues(s, "X-Forwarded-For", ", ")
	if len(s) > xff {
		s = append(s, ", "...)
	}
	s = append(s, forIP...)
	xffEnd := len(s)
	r.Drop("X-Forwarded-For")
	fwd := len(s)
	s = append(s, "for="...)
	s = append(s, forwardedFor...)
	s = append(s, `;host="`...)
	s = append(s, r.Host()...)
	s = append(s, `";proto=http`...)
	fwdEnd := len(s)
	add = append(add[:0], h1.Field{Name: "X-Forwarded-For", Value: s[xff:xffEnd]})
	if _, ok := r.Get("X-Forwarded-Host"); !ok {
		add = append(add, h1.Field{Name: "X-Forwarded-Host", Value: r.Host()})
	}
	if _, ok := r.Get("X-Forwarded-Proto"); !ok {
		add = append(add, h1.Field{Name: "X-Forwarded-Proto", Value: protoHTTP})
	}
	add = append(add, h1.Field{Name: "Forwarded", Value: s[fwd:fwdEnd]})
	if account != "" {
		at := len(s)
		s = append(s, account...)
		add = append(add, h1.Field{Name: HeaderCaller, Value: s[at:]})
	}
	if r.Absolute() || r.Count("Host") == 0 {
		r.Drop("Host")
		add = append(add, h1.Field{Name: "Host", Value: r.Host()})
	}
	// The framing is written from the parsed one, never copied (issue 30):
	// a request that had Content-Length fields goes with exactly one.
	switch f := r.Framing(); {
	case f.Kind == h1.BodyChunked:
		add = append(add, h1.Field{Name: "Transfer-Encoding", Value: chunked})
	case f.Kind == h1.BodyLength || r.Count("Content-Length") > 0:
		add, s = appendLength(add, s, &r.Header, f.Length)
	}
	if upgrade != nil {
		add = append(add, h1.Field{Name: "Connection", Value: upgradeToken}, h1.Field{Name: "Upgrade", Value: upgrade})
	}
	return s, add
}

// appendLength drops h's Content-Length fields and appends one of n to
// add, its value to buf.
func appendLength(add []h1.Field, buf []byte, h *h1.Header, n int64) ([]h1.Field, []byte) {
	h.Drop("Content-Length")
	at := len(buf)
	buf = strconv.AppendInt(buf, n, 10)
	return append(add, h1.Field{Name: "Content-Length", Value: buf[at:]}), buf
}

// answerLength writes an answer's Content-Length for the caller from its
// parsed framing f, never copied (issue 30): one field of a length body's
// length, none with a 204 (RFC 9110 §8.6); otherwise (HEAD, 304, a body
// that is none) the instance's fields, which Read checked, stand. The
// value goes to buf, the field to add.
func answerLength(r *h1.Response, f h1.Framing, add []h1.Field, buf []byte) ([]h1.Field, []byte) {
	switch {
	case f.Kind == h1.BodyLength:
		return appendLength(add, buf, &r.Header, f.Length)
	case r.Status() == http.StatusNoContent:
		r.Drop("Content-Length")
	}
	return add, buf
}

var (
	protoHTTP    = []byte("http")
	chunked      = []byte("chunked")
	upgradeToken = []byte("Upgrade")
	keepAlive    = []byte("keep-alive")
	closeToken   = []byte("close")
)

// sendBody copies the request body to up, as it comes (chunked re-framed
// chunk by chunk), within --max-body-bytes.
func (c *h1conn) sendBody(up *upConn) error {
	c.clearWaitDeadline()
	if c.req.ExpectContinue() {
		c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		if err := c.bw.Flush(); err != nil {
			c.left.Store(true)
			return err
		}
	}
	isChunked := c.req.Framing().Kind == h1.BodyChunked
	c.body.Reset(c.br, c.req.Framing())
	buf := copyBuf.Get().(*[32 << 10]byte)
	defer copyBuf.Put(buf)
	max := c.ls.maxBody
	for {
		n, rerr := c.body.Read(buf[:])
		if n > 0 {
			c.sent = true
			if max > 0 && c.body.N() > max {
				return &http.MaxBytesError{Limit: max}
			}
			var werr error
			if isChunked {
				werr = h1.WriteChunk(up.bw, buf[:n])
			} else {
				_, werr = up.bw.Write(buf[:n])
			}
			if werr != nil {
				return werr
			}
		}
		switch {
		case rerr == io.EOF:
			c.bodyDone = true
			if isChunked {
				return h1.WriteLastChunk(up.bw, c.body.Trailer())
			}
			return nil
		case errors.Is(rerr, h1.ErrMalformed):
			// A 400 for the caller (issue 30's table: a chunk size that
			// overflows); the instance's connection, which has part of
			// the request, is closed.
			return fmt.Errorf("%w: %w", errBadBody, rerr)
		case rerr != nil:
			// The caller's body broke: nothing to send or answer.
			c.left.Store(true)
			return fmt.Errorf("read request body: %w", rerr)
		}
	}
}

// copyBuf holds request body copy buffers.
var copyBuf = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// relay writes the response to the caller and gives up back to the pool
// when the exchange left it reusable. A failure from here on is an abort:
// the caller has (or may have) part of the answer.
func (c *h1conn) relay(up *upConn) result {
	r := &c.resp
	status := r.Status()
	if r.SwitchingProtocols() {
		return c.tunnel(up)
	}
	r.DropHopByHop()
	f := r.Framing()
	// An HTTP/1.1 caller gets a body of unknown length chunked (and keeps
	// its connection); an HTTP/1.0 caller gets it as it comes, then close.
	rechunk := c.req.Minor() >= 1 && (f.Kind == h1.BodyChunked || f.Kind == h1.BodyUntilClose)
	if c.req.Minor() == 0 && (f.Kind == h1.BodyChunked || f.Kind == h1.BodyUntilClose) {
		c.closeAfter = true
	}
	if c.s.shutdown.Load() {
		c.closeAfter = true
	}
	add := c.resAdd[:0]
	switch {
	case rechunk:
		add = append(add, h1.Field{Name: "Transfer-Encoding", Value: chunked})
	default:
		add, c.lenBuf = answerLength(r, f, add, c.lenBuf[:0])
	}
	switch {
	case c.closeAfter:
		add = append(add, h1.Field{Name: "Connection", Value: closeToken})
	case c.req.Minor() == 0:
		add = append(add, h1.Field{Name: "Connection", Value: keepAlive})
	}
	c.resAdd = add[:0]
	_ = h1.WriteResponse(c.bw, r, add)
	var err error
	switch {
	case f.Kind == h1.BodyNone:
		c.flushLater = true
	case f.Kind == h1.BodyLength && f.Length <= int64(up.br.Buffered()):
		// The whole body came with the head (a warm answer): it goes out
		// with the head in one write, after the instance's slot is given
		// back, so that a caller's next request never finds it taken.
		b, _ := up.br.Peek(int(f.Length))
		_, _ = c.bw.Write(b)
		_, _ = up.br.Discard(len(b))
		c.flushLater = true
	default:
		// A stream that stalls is broken off when its caller leaves.
		c.startWatch(watchAfter)
		c.rbody.Reset(up.br, f)
		_, err = h1.Copy(c.bw, &c.rbody, rechunk, true)
		c.stopWatch()
	}
	if err != nil {
		_ = up.Close()
		c.closeAfter = true
		return result{status: status, aborted: c.abortCode(err)}
	}
	if r.KeepAlive() && f.Kind != h1.BodyUntilClose {
		// The pool takes it only with nothing left unread after the end
		// its framing gives (issue 30): bytes beyond it would be taken for
		// the next request's answer. Bytes that come later are found by
		// alive when the connection idled, or read as the next answer,
		// which only this instance's own calls can see.
		// Its deadline stays on in the pool (nothing reads it there): the
		// next request's replaces it.
		c.p.pool.put(up, time.Now())
	} else {
		_ = up.Close()
	}
	return result{status: status}
}

// abortCode is the code of an exchange broken after the response head:
// 499 the caller went away, 504 the request timed out, 502 the instance
// broke off.
func (c *h1conn) abortCode(err error) int {
	var we *h1.WriteError
	switch {
	case errors.As(err, &we), c.left.Load():
		return StatusClientClosed
	case errors.Is(err, os.ErrDeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}

// tunnel relays a 101 and then the bytes of both connections until either
// side closes (the attempt, and with it the instance's slot, lasts as
// long).
func (c *h1conn) tunnel(up *upConn) result {
	c.resp.DropHopByHop()
	upgrade, _ := c.resp.Get("Upgrade")
	up.setDeadline(time.Time{})
	add := append(c.resAdd[:0], h1.Field{Name: "Connection", Value: upgradeToken}, h1.Field{Name: "Upgrade", Value: upgrade})
	c.closeAfter = true
	err := h1.WriteResponse(c.bw, &c.resp, add)
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		_ = up.Close()
		return result{status: http.StatusSwitchingProtocols, aborted: StatusClientClosed}
	}
	c.clearWaitDeadline()
	// Either side ending ends both: the other copy fails at once.
	done := make(chan struct{})
	// The instance's TCP connection itself: its sock is read by this
	// goroutine meanwhile and keeps state for a deferred write (none is
	// pending: the 101 was read after the request went out).
	var toInstance io.Writer = up.Conn
	if up.d != nil {
		toInstance = up.d.tc
	}
	go func() {
		// Caller to instance, starting with what the caller's reader holds.
		_, _ = c.br.WriteTo(toInstance)
		up.abort()
		_ = c.nc.Close()
		close(done)
	}()
	_, _ = up.br.WriteTo(c.nc)
	_ = up.Close()
	_ = c.nc.Close()
	<-done
	return result{status: http.StatusSwitchingProtocols}
}
