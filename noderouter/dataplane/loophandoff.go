package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// The event loops (loop.go) serve the warm exchange only; every other
// request goes to the goroutine path (h1conn) with its connection, either
// before anything of it was sent (handOver: h1conn reads the request again
// from the bytes the loop had read, and serves it as its own), or in the
// middle, once the instance's answer turned out not to be a warm one
// (resumed: h1conn reads the answer from where the loop left it). Either
// way the connection stays with its goroutine until it ends.

// resumed is an exchange an event loop started and hands over in the
// middle: the request went to in, and what came back so far is not an
// answer the loop relays itself (a 1xx, a 101, a body not framed by a
// length or not all read, a head larger than the loop's buffer).
type resumed struct {
	head     []byte   // the request head as the caller sent it
	up       net.Conn // to the instance
	upPrefix []byte   // the answer's bytes the loop read
	addr     string
	reused   bool
	lease    *lease // its instance held
}

// fdConn makes a net.Conn of a socket an event loop owned (already out of
// its epoll set); fd is closed, the net.Conn holds a duplicate.
func fdConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "caller")
	nc, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("hand connection over: %w", err)
	}
	return nc, nil
}

// handOver serves nc on a goroutine of its own from now on: prefix holds
// what the loop read of it and did not answer (a request head, pipelined
// bytes), continued that the loop served requests on it before, r an
// exchange to finish first (nil: none), prior the lease of the request in
// prefix, whose send by the loop failed (nil: none). Connections are taken
// while the server shuts down too: their requests were read already.
func (s *h1Server) handOver(nc net.Conn, prefix []byte, continued bool, r *resumed, prior *lease) {
	c := newH1conn(s, nc)
	c.prefix, c.continued, c.resume, c.prior = prefix, continued, r, prior
	s.mu.Lock()
	if s.closedAll {
		// Close walked the connections already: this one ends here.
		s.mu.Unlock()
		_ = nc.Close()
		gone := outcome{ans: upstreamAnswer(context.Canceled)}
		if r != nil {
			_ = r.up.Close()
			r.lease.done(gone)
		}
		if prior != nil {
			prior.done(gone)
		}
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go c.serve()
}

// finishResumed reads the answer of an exchange an event loop started and
// relays it, then counts the request as proxy.serve does.
func (c *h1conn) finishResumed(r *resumed) {
	p := c.p
	up := newUpConn(r.up, r.addr, r.upPrefix)
	up.reused = r.reused
	up.setDeadline(r.lease.deadline)
	var res result
	if err := c.req.Read(bufio.NewReader(bytes.NewReader(r.head)), max(p.maxHeaderBytes, len(r.head)+1)); err != nil {
		// The loop parsed this head: it cannot fail.
		res.err = fmt.Errorf("read the head again: %w", err)
		_ = up.Close()
	} else {
		c.startRequest()
		c.rewritten = true
		c.up.Store(up)
		if err := c.awaitHead(up); err != nil {
			_ = up.Close()
			res.err = err
		} else {
			res = c.relay(up)
		}
		c.up.Store(nil)
	}
	l := r.lease
	switch {
	case res.err != nil:
		err := res.err
		switch {
		case c.left.Load():
			err = context.Canceled
		case !l.deadline.IsZero() && !time.Now().Before(l.deadline):
			err = context.DeadlineExceeded
		}
		c.closeAfter = true
		p.finish(c, l, outcome{ans: upstreamAnswer(err)})
	default:
		l.upstream += time.Since(l.sent)
		l.done(outcome{status: res.status, aborted: res.aborted})
	}
	c.endRequest()
	if c.flushLater {
		c.flushLater = false
		if err := c.bw.Flush(); err != nil {
			c.closeAfter = true
		}
	}
}

// handOver gives c, with the bytes read of it (a request head first), to
// the goroutine path, for reason (handoverReasons); prior is the lease of
// that request, whose send failed (nil: none).
func (l *evloop) handOver(c *lconn, reason string, prior *lease) {
	l.p.m.handovers[reason].Inc()
	// The connection's new goroutine is queued on this loop's P: the next
	// wait gives the P up, so that it runs without waiting for a
	// preemption of the loop.
	l.quiet = true
	l.forget(c)
	nc, err := fdConn(c.fd)
	if err != nil {
		l.log.Warn("event loop", "err", err)
		if prior != nil {
			prior.done(outcome{ans: upstreamAnswer(context.Canceled)})
		}
		return
	}
	l.s.handOver(nc, bytes.Clone(c.in[:c.n]), c.served > 0, nil, prior)
}

var errUnsentRequest = errors.New("the instance answered before the request was all sent")

// resume hands c and up over in the middle of the exchange: the
// goroutine path reads the answer on from what up.in holds.
func (l *evloop) resume(c *lconn, up *lconn) {
	if len(up.out) > 0 {
		// The request is not all sent (a full send buffer) and an answer
		// came: nothing to hand on.
		c.peer, up.peer = nil, nil
		l.close(up)
		l.fail(c, errUnsentRequest)
		return
	}
	l.p.m.handovers[handoverAnswer].Inc()
	l.quiet = true // see handOver
	handed := new(lease)
	*handed = c.x.ls
	hlen := c.x.hlen
	c.x.busy = false // the lease goes with the exchange
	c.peer, up.peer = nil, nil
	l.forget(c)
	l.forget(up)
	unc, uerr := fdConn(up.fd)
	cnc, cerr := fdConn(c.fd)
	if uerr != nil || cerr != nil {
		for _, nc := range []net.Conn{unc, cnc} {
			if nc != nil {
				_ = nc.Close()
			}
		}
		handed.done(outcome{ans: upstreamAnswer(context.Canceled)})
		l.log.Warn("event loop: hand an exchange over", "err", errors.Join(uerr, cerr))
		return
	}
	l.s.handOver(cnc, bytes.Clone(c.in[hlen:c.n]), true, &resumed{
		head: bytes.Clone(c.in[:hlen]), up: unc, upPrefix: bytes.Clone(up.in[:up.n]), addr: up.addr, reused: up.reused,
		lease: handed,
	}, nil)
}
