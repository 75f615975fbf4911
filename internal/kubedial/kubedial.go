package kubedial

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Dialer dials the API server, waiting out refusals. Its zero value is not
// usable: use New.
type Dialer struct {
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	every time.Duration
	log   *slog.Logger
	life  context.Context // ends every waiting dial

	mu       sync.Mutex
	refused  int       // refused tries since the last accepted one
	downFrom time.Time // first refusal of this outage; zero while up
	warned   time.Time // last warning of this outage
}

// Every is the mean wait between refused tries (each wait is drawn from
// half to one and a half of it, so that many clients do not come back in
// step).
const Every = time.Second

// WarnEvery is how often a refusal that lasts is logged again.
const WarnEvery = time.Minute

// New returns a Dialer whose tries are client-go's default dial (30 s
// connect timeout, 30 s TCP keep-alive); no dial waits past life's end.
// It logs to log when the API server starts refusing, every WarnEvery
// while it goes on, and when it stops.
func New(life context.Context, log *slog.Logger) *Dialer {
	nd := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	return &Dialer{dial: nd.DialContext, every: Every, log: log, life: life}
}

// DialContext is rest.Config's Dial: it tries addr until a try does not
// end in a refusal, waiting Every (jittered) between tries, and returns
// ctx's error (or the lifetime's), with the last refusal, when either ends
// first.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var last error // the last refusal
	for {
		c, err := d.dial(ctx, network, addr)
		if err == nil {
			d.up(addr)
			return c, nil
		}
		if !Refused(err) {
			if cause := ended(ctx); last != nil && cause != nil {
				// The request ended during a try, which failed for that.
				return nil, fmt.Errorf("dial %s, refused until the request ended: %w (last: %w)", addr, cause, last)
			}
			return nil, err
		}
		last = err
		d.down(addr, err)
		t := time.NewTimer(wait.Jitter(d.every/2, 2)) // half to one and a half of every
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("dial %s, refused until the request ended: %w (last: %w)", addr, ctx.Err(), err)
		case <-d.life.Done():
			t.Stop()
			return nil, fmt.Errorf("dial %s, refused until shutdown: %w (last: %w)", addr, d.life.Err(), err)
		case <-t.C:
		}
	}
}

// ended is why ctx ended, or nil. A deadline can fail a connect a moment
// before ctx.Err says so: it counts from the deadline on.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// Refused reports whether err is a connect the peer refused (a reset or an
// ICMP port unreachable: nothing listens, or kube-proxy rejects a Service
// without endpoints).
func Refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}

// Refusals is the number of refused tries since a try was last accepted.
func (d *Dialer) Refusals() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.refused
}

func (d *Dialer) down(addr string, err error) {
	now := time.Now()
	d.mu.Lock()
	if d.downFrom.IsZero() {
		d.downFrom = now
	}
	from := d.downFrom
	warn := d.warned.IsZero() || now.Sub(d.warned) >= WarnEvery
	if warn {
		d.warned = now
	}
	d.refused++
	d.mu.Unlock()
	if warn {
		d.log.Warn("the API server refuses connections; trying again every second until it accepts",
			"address", addr, "refused_for", now.Sub(from).Round(time.Second), "err", err)
	}
}

func (d *Dialer) up(addr string) {
	d.mu.Lock()
	from, n := d.downFrom, d.refused
	d.downFrom, d.refused, d.warned = time.Time{}, 0, time.Time{}
	d.mu.Unlock()
	if !from.IsZero() {
		d.log.Info("the API server accepts connections again", "address", addr, "refused_for", time.Since(from).Round(time.Millisecond), "refused_tries", n)
	}
}
