package noderouter

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"syscall"
	"time"

	"skipper.dev/skipper/noderouter/route"
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

// forwarded is how the forward loop ended: with a result (a response
// relayed, or an exchange aborted after its head) or an answer of the
// router's own; e is the entry it ended with (a retry may have asked the
// owner again).
type forwarded struct {
	e        *route.Entry
	instance *route.Instance // the last one sent to
	res      result
	ans      answer
	// waited: taking instances, backoff and GetInstance; upstream: the
	// sends.
	waited, upstream time.Duration
}

// forward sends the request to an instance of a until one answers or the
// request may not be sent again: a dial failure evicts the instance and is
// retried elsewhere; a connection broken before any response byte is
// retried for idempotent requests whose body was not started; at most
// --max-attempts sends, with jittered exponential backoff, within the
// request's deadline.
func (p *proxy) forward(ex exchange, ref route.Ref, e *route.Entry, a *route.Assignment, deadline time.Time, ps *priorSend) (f forwarded) {
	f.e = e
	// failed are the instances that failed this request, dead the pod UIDs
	// of those evicted; both stay nil on the warm path.
	var failed []*route.Instance
	var dead []string
	n := 1
	if ps != nil {
		// An event loop's send was the first (it evicted a dead
		// instance and checked that the request may be sent again).
		f.instance = ps.in
		failed = append(failed, ps.in)
		dead = ps.dead()
		var ok bool
		if a, ok = p.again(ex, ref, &f, a, n, dead, deadline); !ok {
			return f
		}
		n++
	}
	for ; ; n++ {
		oneshot := a.Config.Oneshot
		t := time.Now()
		in, ans := p.take(ex, ref, f.e, a, failed)
		t1 := time.Now()
		f.waited += t1.Sub(t)
		if ans.status != 0 {
			f.ans = ans
			return f
		}
		f.instance = in
		f.res = p.attempt(ex, ref, f.e, in, oneshot, deadline)
		t2 := time.Now()
		f.upstream += t2.Sub(t1)
		if f.res.err == nil {
			return f
		}
		err := f.res.err
		switch {
		case ex.gone():
			// The caller went away or the request timed out: answer for
			// that (499/504), whatever the send made of it.
			err = context.Canceled
		case !deadline.IsZero() && !t2.Before(deadline):
			err = context.DeadlineExceeded
		}
		fail := classify(err, err != f.res.err)
		if fail == failDial && !oneshot {
			// The instance is gone (or never was): evict it, retried or not.
			// A broken connection is not enough: the instance may be alive.
			if p.cache.Evict(ref, in.PodUID) {
				p.m.evictions.Inc()
				p.log.Info("instance unreachable; evicted", "function", f.e.Key, "pod", in.Pod, "address", in.Address, "err", err)
			}
			dead = append(dead, in.PodUID)
		}
		if n >= p.maxAttempts || !retryable(fail, idempotent(ex.method(), ex.idempotencyKey()), ex.bodyStarted()) {
			f.ans = upstreamAnswer(err)
			return f
		}
		failed = append(failed, in)
		if fail != failDial {
			p.log.Info("connection to instance broke before a response; retrying", "function", f.e.Key, "pod", in.Pod, "err", err)
		}
		var ok bool
		if a, ok = p.again(ex, ref, &f, a, n, dead, deadline); !ok {
			return f
		}
	}
}

// priorSend is an event loop's send of a request that failed before any
// response: the core goes on from there (proxy.serve, forward).
type priorSend struct {
	in    *route.Instance
	err   error
	start time.Time // the request's head was read
}

// dead is the pod UID the send found unreachable, nil when none.
func (ps *priorSend) dead() []string {
	if ps == nil || !isDialError(ps.err) {
		return nil
	}
	return []string{ps.in.PodUID}
}

// again prepares the send after the failed send n: the backoff, then the
// cached set, or the owner's when it ran dry (naming dead, what failed to
// dial). false: f holds the answer instead.
func (p *proxy) again(ex exchange, ref route.Ref, f *forwarded, a *route.Assignment, n int, dead []string, deadline time.Time) (*route.Assignment, bool) {
	p.m.retries.Inc()
	t := time.Now()
	if err := p.backoff(ex, n, deadline); err != nil {
		f.ans = upstreamAnswer(err)
		return a, false
	}
	f.waited += time.Since(t)
	if _, next := p.cache.Lookup(ref); next != nil && (len(next.Instances) > 0 || next.Config.Oneshot) {
		return next, true
	}
	t = time.Now()
	ne, na, err := p.resolver.resolve(ex.ctx(), ref, a.Generation, dead, p.callerAt(ex.callerAddr()))
	f.waited += time.Since(t)
	if err != nil {
		f.ans, _ = controllerAnswer(err)
		return a, false
	}
	f.e = ne
	return na, true
}

// backoff waits before the next of n sends: the jittered backoff, cut at
// the request's deadline (then context.DeadlineExceeded) and by the caller
// going away (context.Canceled).
func (p *proxy) backoff(ex exchange, n int, deadline time.Time) error {
	d := backoff(n, p.backoffBase, p.backoffMax, rand.Float64())
	late := false
	if !deadline.IsZero() {
		if left := time.Until(deadline); left < d {
			d, late = max(left, 0), true
		}
	}
	if err := sleep(ex.ctx(), d); err != nil {
		return err
	}
	if late {
		return context.DeadlineExceeded
	}
	return nil
}
