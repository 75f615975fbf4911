package dataplane

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"syscall"
	"time"
)

// HeaderIdempotencyKey makes a POST or PATCH safe to resend
// (draft-ietf-httpapi-idempotency-key-header).
const HeaderIdempotencyKey = "Idempotency-Key"

// failure is what an attempt that got no response tells about resending it.
type failure int

const (
	// failOther: a timeout, the caller going away, a protocol error, a body
	// over the limit. Never retried.
	failOther failure = iota
	// failDial: no connection was made; the request never left the router.
	// The instance is evicted.
	failDial
	// failConn: the connection broke before any response byte (reset,
	// EOF, broken pipe). The instance may have seen the request.
	failConn
)

// errServerClosedIdle is net/http's unexported errServerClosedIdle: the
// instance closed a kept-alive connection as the request went out on it.
// The transport resends only replayable requests itself and returns this
// for the rest, so it is matched by its text.
const errServerClosedIdle = "http: server closed idle connection"

// classify sorts a transport error of an attempt that got no response.
// reqDone says the request's own context (caller gone, request timeout)
// had ended: then nothing is retried and no instance is blamed. A dial that
// timed out is a dial failure although its error matches
// context.DeadlineExceeded (net's timeout error does): an instance whose
// address went away (its network namespace removed) drops the SYN instead
// of refusing it.
func classify(err error, reqDone bool) failure {
	var tooLarge *http.MaxBytesError
	switch {
	case err == nil, reqDone, errors.As(err, &tooLarge), errors.Is(err, errBadBody):
		return failOther
	case isDialError(err):
		return failDial
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return failOther
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), err.Error() == errServerClosedIdle:
		return failConn
	default:
		return failOther
	}
}

// idempotent reports whether resending a request whose exchange broke
// cannot do anything twice: the method is idempotent (RFC 9110 9.2.2) or
// the caller sent an Idempotency-Key.
func idempotent(method string, hasKey bool) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete, http.MethodTrace:
		return true
	}
	return hasKey
}

// retryable decides whether an attempt that failed with f may be sent
// again. A body of which anything was read is gone (the router does not
// buffer bodies), so it is never resent whatever the method. A dial failure
// never reached the instance; a broken connection may have, so only an
// idempotent request is resent after one.
func retryable(f failure, idempotent, bodyStarted bool) bool {
	if bodyStarted {
		return false
	}
	switch f {
	case failDial:
		return true
	case failConn:
		return idempotent
	default:
		return false
	}
}

// backoff returns the wait before retry n (1 is the first): base doubled
// n-1 times, capped at max, with equal jitter — half of it fixed, half
// scaled by u in [0, 1) — so routers retrying against the same dead
// instance spread out but never retry at once.
func backoff(n int, base, max time.Duration, u float64) time.Duration {
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	return d/2 + time.Duration(u*float64(d-d/2))
}

// sleep waits d or until ctx ends, and returns ctx's error in that case.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// move is what a request does after a send that failed before any
// response.
type move int

const (
	// moveAnswer: no more sends; the failure is answered.
	moveAnswer move = iota
	// moveFresh: at once, to the same instance on a new connection.
	moveFresh
	// moveElsewhere: after the backoff, to another instance when there is
	// one (the cached set, or the owner's when it ran dry).
	moveElsewhere
)

// next decides what a request does after send number sends (a send again
// on a fresh connection not counted) failed with f. stale: it went out on
// a kept-alive connection the instance had closed while it idled (EOF or
// reset before any response byte), which is sent again once on a new
// connection first, as net/http's transport does, unless some of the body
// went. Then it is sent elsewhere if retryable allows and --max-attempts
// (maxAttempts) is not reached. Every transport asks this, for every
// failed send.
func next(f failure, stale bool, sends, maxAttempts int, idempotent, bodyStarted, freshTried bool) move {
	switch {
	case stale && !freshTried && !bodyStarted:
		return moveFresh
	case sends >= maxAttempts || !retryable(f, idempotent, bodyStarted):
		return moveAnswer
	}
	return moveElsewhere
}

// forward sends the lease's request to its instance until one answers or
// the request may not be sent again (next), and ends the lease: a dial
// failure evicts the instance and is retried elsewhere; a connection
// broken before any response byte is retried for idempotent requests
// whose body was not started; at most --max-attempts sends, with jittered
// exponential backoff, within the request's deadline.
func (p *Proxy) forward(ex exchange, l *lease) {
	// Issue 13: a panic out of a transport (net/http swallows its
	// handlers') must not keep the slot: the lease ends as a broken
	// exchange, then the panic goes on.
	defer func() {
		if r := recover(); r != nil {
			if !l.ended {
				l.done(outcome{aborted: http.StatusBadGateway})
			}
			panic(r)
		}
	}()
	ex.setCaller(l.account)
	fresh := false
	for {
		if l.in == nil {
			// A failed send gave its instance back (an event loop's too).
			if ans := l.again(ex.ctx); ans.status != 0 {
				p.finish(ex, l, outcome{ans: ans})
				return
			}
		}
		if !fresh {
			l.sends++
		}
		t := time.Now()
		res := ex.send(l.in, l.deadline, fresh)
		end := time.Now()
		l.upstream += end.Sub(t)
		if res.err == nil {
			l.done(outcome{status: res.status, aborted: res.aborted, end: end})
			return
		}
		err := res.err
		switch {
		case ex.gone():
			// The caller went away or the request timed out: answer for
			// that (499/504), whatever the send made of it.
			err = context.Canceled
		case !l.deadline.IsZero() && !end.Before(l.deadline):
			err = context.DeadlineExceeded
		}
		switch l.failedSend(err, err != res.err, res.reused, ex.bodyStarted()) {
		case moveAnswer:
			p.finish(ex, l, outcome{ans: upstreamAnswer(err)})
			return
		case moveFresh:
			fresh = true
		case moveElsewhere:
			fresh = false
		}
	}
}

// backoff waits before the send after send n: the jittered backoff, cut at
// the request's deadline (then context.DeadlineExceeded) and by ctx, the
// caller going away (context.Canceled).
func (p *Proxy) backoff(ctx context.Context, n int, deadline time.Time) error {
	d := backoff(n, p.backoffBase, p.backoffMax, rand.Float64())
	late := false
	if !deadline.IsZero() {
		if left := time.Until(deadline); left < d {
			d, late = max(left, 0), true
		}
	}
	if err := sleep(ctx, d); err != nil {
		return err
	}
	if late {
		return context.DeadlineExceeded
	}
	return nil
}
