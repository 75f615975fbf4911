package dataplane

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"time"

	"skipper.dev/skipper/noderouter/route"
)

// request is what admission needs to know of a request, whichever
// transport read it.
type request struct {
	fh, host string // X-Skipper-Function's value ("": absent), Host
	// length is the body's declared length: -1 when unknown (chunked), 0
	// without a body.
	length int64
	from   netip.Addr // the caller's source address (zero: not known)
	start  time.Time  // the head was read
	// idempotent: the request may be sent again after a connection broke
	// (retry.go idempotent).
	idempotent bool
}

// verdict is admit's: a lease on an instance, or the router's own answer
// (counted already; fn is the function its body names), or neither: the
// request must wait (a cold start, a oneshot instance, the queue), which
// an event loop does not do: wait says why it hands the request over.
type verdict struct {
	lease *lease
	ans   answer
	fn    string
	wait  string
}

// A lease is an admitted request's hold on the router, from admission to
// its end: the router-wide in-flight count (--max-in-flight) and, while a
// send is under way, an instance (its slot below the concurrencyLimit, or
// a oneshot instance) with its function's in-flight count. done is the one
// give-back and the one count of the request's end, whichever transport
// served it; an event loop that hands its request over hands the lease
// with it.
type lease struct {
	p   *Proxy
	ref route.Ref
	e   *route.Entry // nil until the cache or the owner gave one
	a   *route.Assignment
	in  *route.Instance // held: its slot and e's in-flight count (nil: none)
	// oneshot: in is a oneshot instance, given back to the control plane.
	oneshot bool
	counted bool // holds one of proxy.inFlight
	ended   bool

	from       netip.Addr
	start      time.Time
	deadline   time.Time // zero: none
	maxBody    int64     // the body limit: the function's, else --max-body-bytes (0: none)
	idempotent bool
	account    string // X-Skipper-Caller ("": not sent)

	sends int // sends made, not counting one again on a fresh connection
	// freshTried: the request was sent again on a new connection after a
	// kept-alive one turned out closed.
	freshTried bool
	failed     []*route.Instance // instances that failed this request
	dead       []string          // pod UIDs that could not be dialled
	sent       time.Time         // the last send went out (event loops)
	// waited: GetInstance, the queue and backoff; upstream: the sends.
	waited, upstream time.Duration
}

// bodyLimit is the request body limit of function a: its own, else
// --max-body-bytes; 0: none.
func (p *Proxy) bodyLimit(a *route.Assignment) int64 {
	if a.Config.MaxBodyBytes > 0 {
		return a.Config.MaxBodyBytes
	}
	return p.maxBodyBytes
}

// admit takes a request from its name to an instance: parse, the cache,
// the limits, GetInstance on a miss, the function's callers, an instance
// with a free slot (or the queue). ctx is the request's context, asked
// for only when the request must wait; nil: it may not (an event loop),
// and the verdict says why instead. l is filled, and is the verdict's
// lease when the request was admitted.
func (p *Proxy) admit(l *lease, q request, ctx func() context.Context) verdict {
	*l = lease{p: p, from: q.from, start: q.start, idempotent: q.idempotent, failed: l.failed[:0]} // dead may reach a shared GetInstance that outlives the request: never reused
	ref, err := p.parseName(q.fh, q.host)
	l.ref = ref
	if err != nil {
		return l.refuse(parseAnswer(err))
	}
	// The limits answer with the entry (counted on the function) when the
	// cache holds one, never with a name the caller may have made up.
	e, a := p.cache.Lookup(ref)
	cold := a == nil || len(a.Instances) == 0 && !a.Config.Oneshot
	if ctx == nil && (cold || a.Config.Oneshot) {
		return verdict{wait: handoverCold} // GetInstance
	}
	l.e = e
	if p.maxInFlight > 0 {
		l.counted = true
		if p.inFlight.Add(1) > p.maxInFlight {
			return l.refuse(overloadedAnswer(p.maxInFlight))
		}
	}
	// A body known too large before a byte of it is read gets no
	// instance, and no GetInstance when the function's limit is known (a
	// function seen before); a body of unknown length is limited as it
	// streams.
	if a != nil {
		if l.maxBody = p.bodyLimit(a); l.maxBody > 0 && q.length > l.maxBody {
			return l.refuse(tooLargeAnswer(l.maxBody))
		}
	}
	if cold {
		l.e = nil
		if p.negative.Contains(ref, q.start) {
			p.m.cacheNegative.Inc()
			return l.refuse(unknownAnswer(ref))
		}
		p.m.cacheMiss.Inc()
		var known uint64
		if a != nil {
			known = a.Generation
		}
		t := time.Now()
		e, a, err = p.resolver.Resolve(ctx(), ref, known, nil, p.callerAt(q.from))
		l.waited += time.Since(t)
		if err != nil {
			ans, _ := controllerAnswer(err)
			return l.refuse(ans)
		}
		l.e = e
		// Again with the config GetInstance brought (the first call of a
		// function this router has not seen had none).
		if l.maxBody = p.bodyLimit(a); l.maxBody > 0 && q.length > l.maxBody {
			l.a = a
			return l.refuse(tooLargeAnswer(l.maxBody))
		}
	}
	l.a = a
	if pol := a.Config.Callers; pol != nil {
		who := p.callerAt(q.from)
		if ans, ok := callerRefused(pol, who, ref); !ok {
			return l.refuse(ans)
		}
		l.account = who.ID.Account
	}
	timeout := p.requestTimeout
	if a.Config.Timeout > 0 {
		timeout = a.Config.Timeout
	}
	if timeout > 0 {
		l.deadline = q.start.Add(timeout)
	}
	ans, wait := l.take(ctx)
	switch {
	case wait:
		l.done(outcome{}) // nothing was counted: the goroutine path admits it again
		return verdict{wait: handoverBusy}
	case ans.status != 0:
		return l.refuse(ans)
	}
	if !cold {
		p.m.cacheHit.Inc()
	}
	return verdict{lease: l}
}

// refuse ends the lease with the router's own answer ans.
func (l *lease) refuse(ans answer) verdict {
	return verdict{ans: ans, fn: l.done(outcome{ans: ans})}
}

// take holds the instance for the next send, or returns the answer to
// give instead, or wait when the request must queue and ctx is nil. A
// oneshot function gets a fresh instance from the control plane.
// Otherwise the power of two choices over the instances below the
// concurrency limit, skipping those that failed this request when others
// are left; when every instance is at the limit the request queues (at
// most --max-queue per function, waiting at most --cold-start-timeout).
func (l *lease) take(ctx func() context.Context) (ans answer, wait bool) {
	p, a := l.p, l.a
	if a.Config.Oneshot {
		t := time.Now()
		in, err := p.resolver.Oneshot(ctx(), l.ref, p.callerAt(l.from))
		l.waited += time.Since(t)
		if err != nil {
			ans, _ := controllerAnswer(err)
			return ans, false
		}
		l.hold(in, true)
		return answer{}, false
	}
	limit := a.Config.ConcurrencyLimit
	in := a.Acquire(rand.Uint64(), limit, l.failed)
	if in == nil && len(l.failed) > 0 {
		// Every instance left failed this request once (dial failures are
		// evicted): try the least loaded again rather than fail.
		in = a.Acquire(rand.Uint64(), limit, nil)
	}
	if in != nil {
		l.hold(in, false)
		return answer{}, false
	}
	noInstances := answer{status: http.StatusServiceUnavailable, reason: ReasonNoInstances,
		msg: "the function has no usable instance", retryAfter: true, known: true}
	switch {
	case limit == 0 || len(a.Instances) == 0:
		return noInstances, false
	case p.maxQueue == 0:
		return queueFullAnswer(limit), false
	case ctx == nil:
		return answer{}, true
	}
	c := ctx()
	qctx, cancel := context.WithTimeout(c, p.coldStartTimeout)
	defer cancel()
	p.m.queued.Inc()
	t := time.Now()
	in, err := l.e.Wait(qctx, p.maxQueue)
	l.waited += time.Since(t)
	p.m.queued.Dec()
	switch {
	case in != nil:
		// Before the context cases: the slot is held, and a caller gone
		// meanwhile is answered after the send, which gives it back.
		l.hold(in, false)
		return answer{}, false
	case errors.Is(err, route.ErrQueueFull):
		return queueFullAnswer(limit), false
	case c.Err() != nil:
		return upstreamAnswer(c.Err()), false
	case err != nil:
		return answer{status: http.StatusServiceUnavailable, reason: ReasonQueueTimeout,
			msg: "every instance stayed at the concurrency limit for the cold-start timeout", retryAfter: true, known: true}, false
	default:
		return noInstances, false // the set was withdrawn while the request waited
	}
}

// hold makes in, whose slot the assignment handed out, the lease's
// instance.
func (l *lease) hold(in *route.Instance, oneshot bool) {
	l.in, l.oneshot = in, oneshot
	l.e.InFlight.Add(1)
	in.Requests.Add(1)
}

// give gives the lease's instance back: a oneshot instance to the control
// plane (after its one send, also when the caller went away), or a slot
// to its function's entry, which may hand it to a queued request. Issue
// 13: a give-back skipped on one way out leaked the slot for good; done
// and a failed send are the only callers.
func (l *lease) give() {
	in := l.in
	if in == nil {
		return
	}
	l.in = nil
	if l.oneshot {
		l.p.resolver.Release(l.ref, in.PodUID)
	} else {
		l.e.Release(in)
	}
	l.e.InFlight.Add(-1)
}

// outcome is how a request ended: an instance's answer relayed (status),
// an exchange broken after the answer's head went out (aborted: 499, 502
// or 504), or an answer of the router's own (ans); the zero outcome is a
// request handed on before anything of it counted. end is when (zero:
// now).
type outcome struct {
	status  int
	aborted int
	ans     answer
	end     time.Time
}

// done ends the lease: the instance and the in-flight counts are given
// back and the request is counted as o says. It returns the function the
// router's own answer names ("" when the request named none).
func (l *lease) done(o outcome) string {
	if l.ended {
		l.p.log.Error("a request's lease ended twice", "function", l.ref.String())
		return ""
	}
	l.ended = true
	p := l.p
	fn := ""
	switch {
	case o.ans.status != 0:
		fn = p.count(l.e, o.ans, l.ref)
	case o.aborted != 0:
		p.aborted(l, o.status, o.aborted)
	case o.status != 0:
		end := o.end
		if end.IsZero() {
			end = time.Now()
		}
		p.served(l, o.status, end)
	}
	l.give()
	if l.counted {
		p.inFlight.Add(-1)
	}
	return fn
}

// failedSend weighs a send to the lease's instance that failed before any
// response with err (reqDone: err is the caller's going away or the
// request's deadline, not the send's own), on a kept-alive connection
// (reused) or not, with some of the body sent or not, and returns what
// the request does next. For every move but moveFresh the instance is
// given back, evicted first when it could not be dialled.
func (l *lease) failedSend(err error, reqDone, reused, bodyStarted bool) move {
	fail := classify(err, reqDone)
	mv := next(fail, reused && !reqDone && retryFresh(err), l.sends, l.p.maxAttempts, l.idempotent, bodyStarted, l.freshTried)
	if mv == moveFresh {
		l.freshTried = true
		return mv
	}
	in := l.in
	if fail == failDial && !l.oneshot {
		// The instance is gone (or never was): evict it, retried or not.
		// A broken connection is not enough: the instance may be alive.
		if l.p.cache.Evict(l.ref, in.PodUID) {
			l.p.m.evictions.Inc()
			l.p.log.Info("instance unreachable; evicted", "function", l.ref.String(), "pod", in.Pod, "address", in.Address, "err", err)
		}
		l.dead = append(l.dead, in.PodUID)
	}
	if mv == moveElsewhere {
		l.freshTried = false // the next instance's kept-alive connection gets its fresh try too
		l.failed = append(l.failed, in)
		if fail != failDial {
			l.p.log.Info("connection to instance broke before a response; retrying", "function", l.ref.String(), "pod", in.Pod, "err", err)
		}
	}
	l.give()
	return mv
}

// again prepares the send after a failed one: the backoff, then the cached
// set, or the owner's when it ran dry (naming what failed to dial), and an
// instance of it. An answer: the request ends with it.
func (l *lease) again(ctx func() context.Context) answer {
	p := l.p
	p.m.retries.Inc()
	t := time.Now()
	if err := p.backoff(ctx(), l.sends, l.deadline); err != nil {
		return upstreamAnswer(err)
	}
	l.waited += time.Since(t)
	if _, next := p.cache.Lookup(l.ref); next != nil && (len(next.Instances) > 0 || next.Config.Oneshot) {
		l.a = next
	} else {
		t = time.Now()
		ne, na, err := p.resolver.Resolve(ctx(), l.ref, l.a.Generation, l.dead, p.callerAt(l.from))
		l.waited += time.Since(t)
		if err != nil {
			ans, _ := controllerAnswer(err)
			return ans
		}
		l.e, l.a = ne, na
	}
	ans, _ := l.take(ctx)
	return ans
}
