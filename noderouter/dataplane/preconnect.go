package dataplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/internal/tick"
)

// Pre-connection (issue 15, the first call): a function's first call used
// to dial its instance once GetInstance had named it, and on the 2-core VM
// the dial and the instance's start of a new connection were about a tenth
// of a cold call (docs/benchmarks.md). A DaemonSet router keeps one idle
// kept-alive connection to each ready, unclaimed pool pod (at most
// --preconnect-pool-pods), in the pool the goroutine path (h1conn) takes
// instance connections from, which serves every cache miss, the event
// loops' included (they hand a miss over): whichever pod a claim assigns,
// the first call is written on a connection already open. (The event
// loops' own warm connections are their own, dialled as before.) The connection is opened with the instance's
// read-only GET of the assign endpoint (the request the controllers'
// pre-connections send), which leaves it idle on the instance's side
// rather than waiting for a first request, and the same GET renews it
// before either side's idle timeout. A pod whose sidecar serves the assign
// endpoint (skipper-agent) is pre-connected with its application's own
// HTTP readiness probe instead (PreconnectTo), a GET the kubelet already
// sends; one without such a probe is not pre-connected. The pods come from the router's pod
// watch (the caller index's). A pre-opened connection the instance closed
// meanwhile is found out as any pooled one is (upstream's check, send's
// retry).

// preconnectTick is how often the renewal looks for connections due.
const preconnectTick = 5 * time.Second

// preconnectParallel bounds the pre-connections opened at once.
const preconnectParallel = 4

// preconnectTimeout bounds one pre-connection (dial and GET).
const preconnectTimeout = 2 * time.Second

// PreconnectTarget is where a pre-connection to a pool pod goes and what
// it asks there.
type PreconnectTarget struct {
	// Addr is the instance's address: the pod IP and its instance port.
	Addr string
	// ReadyPath is set for a pod whose sidecar serves the assign endpoint
	// (skipper-agent): the path of its application's HTTP readiness probe
	// on that port, which the pre-connection GETs, as the kubelet does
	// every period (so it is one the application answers, and safe to
	// ask). Empty: the pod serves the contract itself, and the
	// pre-connection GETs its assign endpoint.
	ReadyPath string
}

// PreconnectTo returns the target of the router's pre-connection to pool
// pod p, when it should hold one: a warm pool pod (v1alpha1.WarmPoolPodPort,
// the test the controllers' pre-connections use) serving the contract on
// its instance's port, or whose sidecar serves it (v1alpha1.SidecarAssigns)
// and whose application has an HTTP readiness probe on that port (without
// a host or headers of its own): the application's port answers no GET of
// the assign endpoint.
func PreconnectTo(p *corev1.Pod) (PreconnectTarget, bool) {
	port, ok := v1alpha1.WarmPoolPodPort(p)
	if !ok {
		return PreconnectTarget{}, false
	}
	t := PreconnectTarget{Addr: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port)))}
	if !v1alpha1.SidecarAssigns(p) {
		return t, true
	}
	if t.ReadyPath, ok = readinessPath(&p.Spec, port); !ok {
		return PreconnectTarget{}, false
	}
	return t, true
}

// readinessPath is the path of the HTTP readiness probe on port of the
// container that declares port, if it has one the router can send as is.
func readinessPath(spec *corev1.PodSpec, port int32) (string, bool) {
	for _, c := range spec.Containers {
		i := slices.IndexFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.ContainerPort == port })
		if i < 0 {
			continue
		}
		pr := c.ReadinessProbe
		if pr == nil || pr.HTTPGet == nil {
			return "", false
		}
		g := pr.HTTPGet
		onPort := g.Port.Type == intstr.Int && g.Port.IntVal == port ||
			g.Port.Type == intstr.String && g.Port.StrVal != "" && g.Port.StrVal == c.Ports[i].Name
		plain := (g.Scheme == "" || g.Scheme == corev1.URISchemeHTTP) && g.Host == "" && len(g.HTTPHeaders) == 0
		path := g.Path
		if path == "" {
			path = "/"
		}
		if !onPort || !plain || path[0] != '/' || strings.ContainsAny(path, " \r\n") {
			return "", false
		}
		return path, true
	}
	return "", false
}

// preconnTarget is a pool pod the router holds a connection to.
type preconnTarget struct {
	addr string
	path string    // PreconnectTarget.ReadyPath
	rv   string    // the pod's resourceVersion when last seen
	at   time.Time // opened or renewed last; zero: due at once
	busy bool      // a pre-connection to it is being opened
}

// Preconnector keeps the pre-connections (NewPreconnector); the router's
// pod watch feeds it (Observe, SetList) and Run owns its goroutines. Its
// lock is taken alone, but for fill, which reads the pod watch's cache
// under it (the watch calls Observe holding none of its own locks).
type Preconnector struct {
	pool  *upstreamPool
	max   int
	renew time.Duration
	log   *slog.Logger
	m     *Metrics
	slots chan struct{}

	mu      sync.Mutex
	targets map[string]*preconnTarget // by pod UID
	ctx     context.Context           // nil until run
	stopped bool                      // Run is ending: nothing more starts
	list    func() []any              // the pod watch's cached pods (setList), for room the bound left
	missed  bool                      // a pod was turned away for the bound since the last fill
	// skip holds pods (by UID) whose address answered as another pod,
	// with the resourceVersion then: not targets again until they change.
	skip map[string]string
	wg   sync.WaitGroup // the pre-connections being opened
}

// NewPreconnector keeps up to max pre-connections in p's pool, renewed
// before its idle timeout would close them. CanPreconnect says whether
// p's Options allow it.
func NewPreconnector(p *Proxy, max int, log *slog.Logger) *Preconnector {
	return newPreconnector(p.pool, max, preconnectRenewal(p.opts.IdleConnTimeout), p.m, log)
}

// newPreconnector keeps up to max pre-connections in pool, renewed every
// renew.
func newPreconnector(pool *upstreamPool, max int, renew time.Duration, m *Metrics, log *slog.Logger) *Preconnector {
	return &Preconnector{pool: pool, max: max, renew: renew, m: m, log: log,
		slots: make(chan struct{}, preconnectParallel), targets: map[string]*preconnTarget{}, skip: map[string]string{}}
}

// preconnectRenewal is how long a pre-connection goes before its GET is
// sent again: half the router's idle timeout (its pool would close it
// then), at most 50 s (under the echo runtime's 2-minute idle timeout).
func preconnectRenewal(idleConnTimeout time.Duration) time.Duration {
	return min(idleConnTimeout/2, 50*time.Second)
}

// CanPreconnect reports whether a router with o can keep pre-connections
// and, when not, why. They fill the pool the goroutine path dials from
// (not net/http's), and a renewal must come before the pool's idle timeout
// closes the connection. (Whether the router wants them at all, and has
// the pod watch they ride on, is its own choice.)
func CanPreconnect(o Options) (bool, string) {
	switch {
	case o.Forwarder == ForwarderNethttp:
		return false, "--forwarder nethttp keeps no pool of instance connections"
	case preconnectRenewal(o.IdleConnTimeout)+preconnectTick >= o.IdleConnTimeout:
		return false, fmt.Sprintf("--idle-conn-timeout %s is %s or less: a pre-connection could close before its renewal (a tick after it is due)", o.IdleConnTimeout, 2*preconnectTick)
	}
	return true, ""
}

// SetList gives pc the pod watch's cache: a tick that finds room under the
// bound after pods were turned away for it fills it from there, since the
// watch announces a pod only when it changes.
func (pc *Preconnector) SetList(list func() []any) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.list = list
}

// Observe takes a pod event of the router's pod watch: a pool pod that
// qualifies becomes a target, opened at once when a slot is free (else at
// the next tick); one that stops qualifying is dropped (its connection,
// when a claim made it an instance's, serves the function). It never
// blocks the informer.
func (pc *Preconnector) Observe(p *corev1.Pod, deleted bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.observeLocked(p, deleted)
}

// observeLocked is Observe with pc.mu held.
func (pc *Preconnector) observeLocked(p *corev1.Pod, deleted bool) {
	uid := string(p.UID)
	to, ok := PreconnectTo(p)
	addr := to.Addr
	t := pc.targets[uid]
	if rv, skipped := pc.skip[uid]; skipped {
		if !deleted && rv == p.ResourceVersion {
			return
		}
		delete(pc.skip, uid)
	}
	if deleted || !ok {
		delete(pc.targets, uid)
		return
	}
	switch {
	case t != nil && t.addr == addr && t.path == to.ReadyPath:
	case t != nil:
		t.addr, t.path, t.at = addr, to.ReadyPath, time.Time{}
	case len(pc.targets) >= pc.max:
		pc.missed = true
		return
	default:
		t = &preconnTarget{addr: addr, path: to.ReadyPath}
		pc.targets[uid] = t
	}
	t.rv = p.ResourceVersion
	if pc.ctx == nil || pc.ctx.Err() != nil || pc.stopped || t.busy || !t.at.IsZero() {
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
func (pc *Preconnector) startLocked(uid string, t *preconnTarget) {
	t.busy = true
	addr, path, ctx := t.addr, t.path, pc.ctx
	pc.wg.Go(func() {
		defer func() { <-pc.slots }()
		err := pc.open(ctx, uid, addr, path)
		pc.mu.Lock()
		t.busy = false
		switch {
		case err == nil:
			t.at = time.Now()
		case errors.Is(err, errOtherPod) && pc.targets[uid] == t:
			// Another pod has the address (the watch is behind): not a
			// target until the pod changes.
			delete(pc.targets, uid)
			pc.skip[uid] = t.rv
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

// dueLocked returns the targets, not busy, whose connection is to be
// opened or renewed at now.
func (pc *Preconnector) dueLocked(now time.Time) map[string]*preconnTarget {
	out := map[string]*preconnTarget{}
	for uid, t := range pc.targets {
		if !t.busy && pc.isDueLocked(t, now) {
			out[uid] = t
		}
	}
	return out
}

func (pc *Preconnector) isDueLocked(t *preconnTarget, now time.Time) bool {
	return t.at.IsZero() || now.Sub(t.at) >= pc.renew
}

// fill makes targets of the watch's cached warm pool pods when a pod was
// turned away for the bound and there is room now. It holds pc.mu across
// the walk: an event the cache's copy does not reflect yet is applied
// after it (the informer updates its cache before it calls the handler),
// so no stale copy is taken after a newer event.
func (pc *Preconnector) fill() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.list == nil || !pc.missed || len(pc.targets) >= pc.max {
		return
	}
	pc.missed = false
	for _, obj := range pc.list() {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			continue
		}
		if _, known := pc.targets[string(p.UID)]; !known {
			pc.observeLocked(p, false) // sets missed again when the bound is reached
		}
	}
}

// Run opens and renews the pre-connections until ctx ends, then waits for
// those being opened (none starts after it stopped).
func (pc *Preconnector) Run(ctx context.Context) {
	pc.mu.Lock()
	pc.ctx = ctx
	pc.mu.Unlock()
	defer func() {
		pc.mu.Lock()
		pc.stopped = true
		pc.mu.Unlock()
		pc.wg.Wait()
	}()
	tick.Every(ctx, preconnectTick, func(now time.Time) {
		pc.fill()
		pc.mu.Lock()
		due := pc.dueLocked(now)
		pc.mu.Unlock()
		for uid, t := range due {
			select {
			case pc.slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			pc.mu.Lock()
			if pc.targets[uid] == t && !t.busy && pc.isDueLocked(t, time.Now()) {
				pc.startLocked(uid, t)
			} else {
				<-pc.slots // dropped, started or renewed meanwhile
			}
			pc.mu.Unlock()
		}
	})
}

// open sends the GET of the assign endpoint for pod uid to addr (or, with
// readyPath set, the GET of the application's readiness probe), on the
// pool's idle connection to it (a renewal) or a new one, and returns the
// connection to the pool.
func (pc *Preconnector) open(ctx context.Context, uid, addr, readyPath string) error {
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
	probe := func() error { return probeAssignment(up.bw, up.br, addr, uid) }
	if readyPath != "" {
		probe = func() error { return probeReady(up.bw, up.br, addr, readyPath) }
	}
	if err := probe(); err != nil {
		_ = up.Close()
		return err
	}
	up.setDeadline(time.Time{})
	// The pool's get marks it reused when a request takes it: one that
	// finds it closed by the instance meanwhile is sent again (send).
	pc.pool.put(up, time.Now())
	return nil
}

// probeAssignment writes GET <assign.Path>?pod=uid to w and reads the
// answer from r (preconnectGET): 200 (the instance's assignment) or 404
// (none), not 404 other_pod.
func probeAssignment(w *bufio.Writer, r *bufio.Reader, addr, uid string) error {
	return preconnectGET(w, r, addr, assign.Path+"?pod="+uid, func(status int, body []byte) error {
		switch {
		case status == http.StatusNotFound && assign.IsOtherPod(body):
			return fmt.Errorf("as pod %s: %w", uid, errOtherPod)
		case status != http.StatusOK && status != http.StatusNotFound:
			return errors.New(http.StatusText(status))
		}
		return nil
	})
}

// probeReady writes GET path (an application's readiness probe) to w and
// reads the answer from r (preconnectGET): a status the kubelet counts as
// ready, 200 to 399.
func probeReady(w *bufio.Writer, r *bufio.Reader, addr, path string) error {
	return preconnectGET(w, r, addr, path, func(status int, _ []byte) error {
		if status < 200 || status > 399 {
			return fmt.Errorf("status %d", status)
		}
		return nil
	})
}

// preconnectGET writes GET target to w and reads the answer from r,
// whole (at most probeBodyMax), for accept to judge by its status and
// body, on a connection that stays open with nothing more to read.
func preconnectGET(w *bufio.Writer, r *bufio.Reader, addr, target string, accept func(status int, body []byte) error) error {
	fmt.Fprintf(w, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: skipper-noderouter\r\n\r\n", target, addr)
	if err := w.Flush(); err != nil {
		return fmt.Errorf("GET %s of %s: %w", target, addr, err)
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return fmt.Errorf("GET %s of %s: %w", target, addr, err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, probeBodyMax+1))
	_ = resp.Body.Close()
	switch {
	case err != nil:
		return fmt.Errorf("GET %s of %s: %w", target, addr, err)
	case len(body) > probeBodyMax:
		return fmt.Errorf("GET %s of %s: an answer over %d bytes", target, addr, probeBodyMax)
	}
	if err := accept(resp.StatusCode, body); err != nil {
		return fmt.Errorf("GET %s of %s: %w", target, addr, err)
	}
	switch {
	case resp.Close:
		return fmt.Errorf("GET %s of %s: %w", target, addr, errPreconnectClosed)
	case r.Buffered() > 0:
		return fmt.Errorf("GET %s of %s: bytes after the answer", target, addr)
	}
	return nil
}

// probeBodyMax bounds the answer to the GET read (an assignment is a few
// hundred bytes).
const probeBodyMax = 64 << 10

// errPreconnectClosed: the instance closes the connection after the GET.
var errPreconnectClosed = errors.New("the instance closes the connection")

// errOtherPod: the instance at the address is another pod (its IP was
// reused).
var errOtherPod = errors.New("the instance is another pod")
