package noderouter

import (
	"context"
	"errors"
	"io"
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
	case err == nil, reqDone, errors.As(err, &tooLarge):
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
