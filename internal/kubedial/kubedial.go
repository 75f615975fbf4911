// Package kubedial is the dial function Skipper's Kubernetes clients use:
// a connect the API server refuses is tried again, every second or so,
// until it is accepted or the request's context ends.
//
// Why: a refused connection is what every client sees while a single API
// server restarts behind the kubernetes Service (its lease reconciler
// withdraws the endpoint as it stops, and kube-proxy rejects the Service
// address until the endpoint is back). client-go's reflectors answer each
// refusal with an exponential backoff that reaches 30–60 s after about
// twenty seconds of outage, so a controller's or a router's cache stayed
// up to a minute behind after the API server was back: new Functions
// unknown, gone pods still claimed. Waiting in the dial instead, the
// reflector never sees the refusal and its watch resumes within a second
// of the API server accepting again. A dial that fails otherwise (timeout,
// no route) returns at once, and client-go's own backoff applies.
package kubedial

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"time"
)

// Dialer dials the API server, waiting out refusals. Its zero value is not
// usable: use New.
type Dialer struct {
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	every time.Duration
	log   *slog.Logger

	mu       sync.Mutex
	refused  int       // refused tries since the last accepted one
	downFrom time.Time // first refusal of this outage; zero while up
}

// Every is the mean wait between refused tries (each wait is drawn from
// half to one and a half of it, so that many clients do not come back in
// step).
const Every = time.Second

// New returns a Dialer whose tries are client-go's default dial (30 s
// connect timeout, 30 s TCP keep-alive). It logs to log when the API
// server starts and stops refusing.
func New(log *slog.Logger) *Dialer {
	nd := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	return &Dialer{dial: nd.DialContext, every: Every, log: log}
}

// DialContext is rest.Config's Dial: it tries addr until a try does not
// end in a refusal, waiting Every (jittered) between tries, and returns
// ctx's error, with the last refusal, when ctx ends first.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	for {
		c, err := d.dial(ctx, network, addr)
		if err == nil {
			d.up(addr)
			return c, nil
		}
		if !Refused(err) {
			return nil, err
		}
		d.down(addr, err)
		t := time.NewTimer(Jitter(d.every, rand.Float64()))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("dial %s, refused until the request ended: %w (last: %w)", addr, ctx.Err(), err)
		case <-t.C:
		}
	}
}

// Refused reports whether err is a connect the peer refused (a reset or an
// ICMP port unreachable: nothing listens, or kube-proxy rejects a Service
// without endpoints).
func Refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}

// Jitter is the wait before the next try: every scaled by 0.5 + r, r in
// [0, 1).
func Jitter(every time.Duration, r float64) time.Duration {
	return time.Duration(float64(every) * (0.5 + r))
}

// Refusals is the number of refused tries since a try was last accepted.
func (d *Dialer) Refusals() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.refused
}

func (d *Dialer) down(addr string, err error) {
	d.mu.Lock()
	first := d.downFrom.IsZero()
	if first {
		d.downFrom = time.Now()
	}
	d.refused++
	d.mu.Unlock()
	if first {
		d.log.Warn("the API server refuses connections; trying again every second until it accepts", "address", addr, "err", err)
	}
}

func (d *Dialer) up(addr string) {
	d.mu.Lock()
	from, n := d.downFrom, d.refused
	d.downFrom, d.refused = time.Time{}, 0
	d.mu.Unlock()
	if !from.IsZero() {
		d.log.Info("the API server accepts connections again", "address", addr, "refused_for", time.Since(from).Round(time.Millisecond), "refused_tries", n)
	}
}
