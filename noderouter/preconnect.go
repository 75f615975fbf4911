package noderouter

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
)

// Pre-connection (issue 15, the first call): a function's first call used
// to dial its instance once GetInstance had named it, and on the 2-core VM
// the dial and the instance's start of a new connection were about a tenth
// of a cold call (docs/benchmarks.md). A DaemonSet router keeps one idle
// kept-alive connection to each ready, unclaimed pool pod (at most
// --preconnect-pool-pods), in the pool the h1 forwarder takes instance
// connections from: whichever pod a claim assigns, the router already
// holds a connection to it. The connection is opened with the instance's
// read-only GET of the assign endpoint (the request the controllers'
// pre-connections send), which leaves it idle on the instance's side
// rather than waiting for a first request, and the same GET renews it
// before either side's idle timeout. The pods come from the router's pod
// watch (the caller index's). A pre-opened connection the instance closed
// meanwhile is found out as any pooled one is (upstream's check, send's
// retry).

// preconnectTick is how often the renewal looks for connections due.
const preconnectTick = 5 * time.Second

// preconnectParallel bounds the pre-connections opened at once.
const preconnectParallel = 4

// preconnectTimeout bounds one pre-connection (dial and GET).
const preconnectTimeout = 2 * time.Second

// assignPortName names the container port of a sidecar serving the assign
// endpoint beside the application (BRIEF: skipper-agent); such a pod's
// application port answers no GET of the assign endpoint, so it gets no
// pre-connection.
const assignPortName = "skipper-assign"

// preconnectAddr returns the instance address of pool pod p when the router
// should hold a connection to it: a warm pool pod (v1alpha1.WarmPoolPodPort,
// the test the controllers' pre-connections use) whose assign endpoint is
// on its instance's port.
func preconnectAddr(p *corev1.Pod) (string, bool) {
	port, ok := v1alpha1.WarmPoolPodPort(p)
	if !ok {
		return "", false
	}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == assignPortName {
				return "", false
			}
		}
	}
	return net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port))), true
}

// preconnTarget is a pool pod the router holds a connection to.
type preconnTarget struct {
	addr string
	at   time.Time // opened or renewed last; zero: due at once
	busy bool      // a pre-connection to it is being opened
}

// preconnector keeps the pre-connections. Its lock is taken alone.
type preconnector struct {
	pool  *upstreamPool
	max   int
	renew time.Duration
	log   *slog.Logger
	m     *metrics
	slots chan struct{}

	mu      sync.Mutex
	targets map[string]*preconnTarget // by pod UID
	ctx     context.Context           // nil until run, done when it ends
	wg      sync.WaitGroup            // the pre-connections being opened
}

// newPreconnector keeps up to max pre-connections in pool, renewed every
// renew.
func newPreconnector(pool *upstreamPool, max int, renew time.Duration, m *metrics, log *slog.Logger) *preconnector {
	return &preconnector{pool: pool, max: max, renew: renew, m: m, log: log,
		slots: make(chan struct{}, preconnectParallel), targets: map[string]*preconnTarget{}}
}

// preconnectRenewal is how long a pre-connection goes before its GET is
// sent again: half the router's idle timeout (its pool would close it
// then), at most 50 s (under the echo runtime's 2-minute idle timeout).
func preconnectRenewal(idleConnTimeout time.Duration) time.Duration {
	return min(idleConnTimeout/2, 50*time.Second)
}

// observe takes a pod event of the router's pod watch: a pool pod that
// qualifies becomes a target, opened at once when a slot is free (else at
// the next tick); one that stops qualifying is dropped (its connection,
// when a claim made it an instance's, serves the function). It never
// blocks the informer.
func (pc *preconnector) observe(p *corev1.Pod, deleted bool) {
	uid := string(p.UID)
	addr, ok := preconnectAddr(p)
	pc.mu.Lock()
	defer pc.mu.Unlock()
	t := pc.targets[uid]
	if deleted || !ok {
		delete(pc.targets, uid)
		return
	}
	switch {
	case t != nil && t.addr == addr:
	case t != nil:
		t.addr, t.at = addr, time.Time{}
	case len(pc.targets) >= pc.max:
		return
	default:
		t = &preconnTarget{addr: addr}
		pc.targets[uid] = t
	}
	if pc.ctx == nil || pc.ctx.Err() != nil || t.busy || !t.at.IsZero() {
		return
	}
	select {
	case pc.slots <- struct{}{}:
		pc.startLocked(uid, t)
	default: // the next tick opens it
	}
}

// startLocked opens t's connection on pc.wg, holding a slot the caller
// took. pc.mu is held.
func (pc *preconnector) startLocked(uid string, t *preconnTarget) {
	t.busy = true
	addr, ctx := t.addr, pc.ctx
	pc.wg.Go(func() {
		defer func() { <-pc.slots }()
		err := pc.open(ctx, uid, addr)
		pc.mu.Lock()
		t.busy = false
		if err == nil {
			t.at = time.Now()
		}
		pc.mu.Unlock()
		result := "ok"
		if err != nil {
			result = "failed"
			pc.log.Debug("pre-connect to pool pod failed", "pod_uid", uid, "address", addr, "err", err)
		}
		pc.m.preconnects.WithLabelValues(result).Inc()
	})
}

// due returns the targets whose connection is to be opened or renewed at
// now, marked busy.
func (pc *preconnector) dueLocked(now time.Time) map[string]*preconnTarget {
	out := map[string]*preconnTarget{}
	for uid, t := range pc.targets {
		if !t.busy && (t.at.IsZero() || now.Sub(t.at) >= pc.renew) {
			out[uid] = t
		}
	}
	return out
}

// run opens and renews the pre-connections until ctx ends, then waits for
// those being opened.
func (pc *preconnector) run(ctx context.Context) {
	pc.mu.Lock()
	pc.ctx = ctx
	pc.mu.Unlock()
	defer pc.wg.Wait()
	tick := time.NewTicker(preconnectTick)
	defer tick.Stop()
	for {
		pc.mu.Lock()
		due := pc.dueLocked(time.Now())
		pc.mu.Unlock()
		for uid, t := range due {
			select {
			case pc.slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			pc.mu.Lock()
			if pc.targets[uid] == t && !t.busy {
				pc.startLocked(uid, t)
			} else {
				<-pc.slots // dropped or started meanwhile
			}
			pc.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// open sends the GET of the assign endpoint for pod uid to addr, on the
// pool's idle connection to it (a renewal) or a new one, and returns the
// connection to the pool.
func (pc *preconnector) open(ctx context.Context, uid, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, preconnectTimeout)
	defer cancel()
	up := pc.pool.get(addr, time.Now())
	if up == nil {
		var err error
		if up, err = pc.pool.dial(ctx, addr); err != nil {
			return err
		}
	}
	deadline, _ := ctx.Deadline()
	up.setDeadline(deadline)
	if err := probeAssignment(up.bw, up.br, addr, uid); err != nil {
		_ = up.Close()
		return err
	}
	up.setDeadline(time.Time{})
	// A pre-opened connection counts as reused: the instance may close it
	// while it idles, and a request that finds it closed is sent again.
	up.reused = true
	pc.pool.put(up, time.Now())
	return nil
}

// probeAssignment writes GET <assign.Path>?pod=uid to w and reads the
// answer from r, whole: 200 (the instance's assignment) or 404 (none),
// on a connection that stays open.
func probeAssignment(w *bufio.Writer, r *bufio.Reader, addr, uid string) error {
	fmt.Fprintf(w, "GET %s?pod=%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: skipper-noderouter\r\n\r\n", assign.Path, uid, addr)
	if err := w.Flush(); err != nil {
		return fmt.Errorf("GET assignment of %s: %w", addr, err)
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return fmt.Errorf("GET assignment of %s: %w", addr, err)
	}
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, probeBodyMax+1))
	_ = resp.Body.Close()
	switch {
	case err != nil:
		return fmt.Errorf("GET assignment of %s: %w", addr, err)
	case n > probeBodyMax:
		return fmt.Errorf("GET assignment of %s: an answer over %d bytes", addr, probeBodyMax)
	case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNotFound:
		return fmt.Errorf("GET assignment of %s: %s", addr, resp.Status)
	case resp.Close:
		return fmt.Errorf("GET assignment of %s: %w", addr, errPreconnectClosed)
	case r.Buffered() > 0:
		return fmt.Errorf("GET assignment of %s: bytes after the answer", addr)
	}
	return nil
}

// probeBodyMax bounds the answer to the GET read (an assignment is a few
// hundred bytes).
const probeBodyMax = 64 << 10

// errPreconnectClosed: the instance closes the connection after the GET.
var errPreconnectClosed = errors.New("the instance closes the connection")
