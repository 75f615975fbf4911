package controller

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/scaling"
	"skipper.dev/skipper/internal/tick"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// supervisor is the goroutine that converges one owned Function: every
// --scale-interval it takes a snapshot through its host (ownership, the
// Function, its pods and claims), adds the routers' reports merged into
// a scaling.Window, lets decidePlan (pure, scaling.Decide inside) decide,
// and carries the plan out through the host: it starts claims
// (scale-up), withdraws and drains instances (scale-down), retires
// instances whose container restarted, and writes status.
//
// A supervisor runs while this replica owns the function and the function
// needs one: always when minInstances > 0, otherwise from its first
// reference (a GetInstance, a report with load, a claimed pod) until it is
// idle with no instances. It stops itself on its first tick that finds the
// function gone, owned elsewhere, or idle and empty.
type supervisor struct {
	host    supervisorHost
	cfg     *Config // read only
	log     *slog.Logger
	metrics *metrics
	key     string
	// done is closed when run returns.
	done chan struct{}

	mu     sync.Mutex // guards window and the claim outcome: reports and claims arrive on other goroutines
	window *scaling.Window
	// exhausted says why the last claim found no pool pod; "" once a claim
	// succeeds.
	exhausted string
	// failures counts claims failed in a row for another reason than an
	// empty pool (the instance refused its assignment, the API failed);
	// scale-up waits until retryAt, backing off (backoff: the scale
	// interval doubling up to maxClaimBackoff, begun afresh at the first
	// failure), so a function whose instances never accept it does not
	// churn through its pool.
	failures int
	backoff  wait.Backoff
	retryAt  time.Time

	// deferFirstTick: the first tick waits one interval. Set for a
	// supervisor a GetInstance starts: that call's own claim is the
	// scale-up from zero, and the tick's status patch and Event, written at
	// once, would compete with its claim patch on the API server (the cold
	// start's critical path).
	deferFirstTick bool

	// view is what the last tick decided, for GetState.
	view atomic.Pointer[supervisorView]

	// Owned by the loop.
	history   scaling.History
	desired   int32
	reason    string
	lastScale time.Time
	drains    map[types.UID]*drain
	counts    [5]int // instance counts last written to metrics, in instanceStates order
	// rewrite asks the next tick to write the instance series even when
	// counts did not change: forget deleted them meanwhile.
	rewrite atomic.Bool
	buf     planBuffers // reused between ticks
}

// supervisorHost is the controller as a supervisor reaches it: what a
// tick reads, and what it carries out. *controller implements it;
// supervisor_host_test.go has a fake.
type supervisorHost interface {
	// snapshot returns the controller's part of what a tick of function
	// key at now decides from (the Function, its port, pods and claims),
	// or false when the supervisor is to stop: the Function is gone or
	// being deleted, or this replica no longer owns it.
	snapshot(key string, now time.Time) (planInput, bool)
	// scaleUp starts claims towards want expected instances of fn and
	// returns how many it started.
	scaleUp(fn *v1alpha1.Function, port int32, want int) int
	// withdraw takes pods out of fn's instance set until until, pushes the
	// set to subscribed routers and returns its generation.
	withdraw(fn *v1alpha1.Function, port int32, pods []*corev1.Pod, now, until time.Time) uint64
	// remove deletes an instance (its UID a precondition) and keeps it out
	// of every set until until.
	remove(ctx context.Context, pod *corev1.Pod, reason string, until time.Time)
	// acked reports whether every router subscribed to key holds gen.
	acked(key string, gen uint64) bool
	// event records an Event about fn.
	event(fn *v1alpha1.Function, typ, reason, format string, a ...any)
	// writeStatus patches fn's status to v when it changed.
	writeStatus(ctx context.Context, fn *v1alpha1.Function, v statusView, now time.Time) error
	// reassign hands instances pods fn's current callers, in the
	// background.
	reassign(fn *v1alpha1.Function, port int32, pods []*corev1.Pod)
	// probe asks the instances of the pool pods uids what they hold, in
	// the background, and adopts those that hold a function.
	probe(fn *v1alpha1.Function, port int32, uids []types.UID)
}

var _ supervisorHost = (*controller)(nil)

// supervisorView is a supervisor's last decision as GetState shows it.
type supervisorView struct {
	desired          int32
	reason           string
	inFlight, queued int64
}

// newSupervisor returns the supervisor of function key (fn as the cache
// holds it, or nil) for host, under cfg; run starts it.
func newSupervisor(host supervisorHost, cfg *Config, log *slog.Logger, m *metrics, key string, fn *v1alpha1.Function, now time.Time) *supervisor {
	s := &supervisor{
		host: host, cfg: cfg, log: log, metrics: m, key: key, done: make(chan struct{}),
		window: scaling.NewWindow(now),
		drains: map[types.UID]*drain{},
		counts: [5]int{-1}, // the first tick writes the series
	}
	if fn != nil {
		s.desired, s.reason = fn.Status.Desired, fn.Status.LastScaleReason
		if fn.Status.LastScaleTime != nil {
			s.lastScale = fn.Status.LastScaleTime.Time
		}
	}
	return s
}

// supervisorFor returns key's supervisor, starting one when start is set
// and none runs. It returns nil when none runs and start is not set, or
// when the controller is not running. init, when set, runs on a supervisor
// this call starts before its first tick (so the load that started it is
// in its window then), and fresh reports that it did.
func (c *controller) supervisorFor(key string, start bool, init func(*supervisor)) (_ *supervisor, fresh bool) {
	var took *v1alpha1.Function // taken over from another owner: an Event, sent without c.mu
	defer func() {
		if took != nil {
			c.event(took, corev1.EventTypeNormal, "OwnershipTaken", "controller %s took over from %s", c.cfg.PodName, took.Status.Owner)
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.sups[key]; s != nil || !start || c.runCtx == nil || c.runCtx.Err() != nil {
		return s, false
	}
	ns, name, _ := splitKey(key)
	fn, err := c.cache.function(ns, name)
	if err != nil {
		return nil, false
	}
	now := time.Now()
	s := newSupervisor(c, &c.cfg, c.log, c.metrics, key, fn, now)
	if len(c.cache.functionPods(ns, name)) > 0 || c.claims.flying(key) > 0 {
		// A supervisor that takes over instances does not know when they
		// were last used: it counts the takeover as activity, so idle
		// scale-to-zero waits a full idleTimeout rather than firing at once.
		s.window.Touch(now)
	}
	if init != nil {
		init(s) // s is not shared yet: its lock is free
	}
	c.sups[key] = s
	if fn.Status.Owner != "" && fn.Status.Owner != c.cfg.PodName {
		took = fn
	}
	c.log.Debug("supervisor started", "function", key)
	c.wg.Go(func() {
		defer close(s.done)
		defer c.dropSupervisor(s)
		s.run(c.runCtx)
	})
	return s, true
}

// snapshot implements supervisorHost.
func (c *controller) snapshot(key string, now time.Time) (planInput, bool) {
	ns, name, _ := splitKey(key)
	fn, err := c.cache.function(ns, name)
	if err != nil || fn.DeletionTimestamp != nil {
		return planInput{}, false
	}
	if !c.owns(key) {
		c.log.Info("ownership moved, supervisor stops", "function", key, "owner", c.owner(key))
		return planInput{}, false
	}
	in := planInput{Now: now, Function: fn}
	in.Port, in.PortErr = c.port(fn)
	in.Pods = c.cache.functionPods(ns, name)
	in.Claims = c.claims.view(key, in.Pods, now)
	return in, true
}

// touch marks key active now (a GetInstance), starting its supervisor.
func (c *controller) touch(key string, now time.Time) {
	touch := func(s *supervisor) {
		s.mu.Lock()
		s.window.Touch(now)
		s.mu.Unlock()
	}
	start := func(s *supervisor) {
		s.deferFirstTick = true
		touch(s)
	}
	if s, fresh := c.supervisorFor(key, true, start); s != nil && !fresh {
		touch(s)
	}
}

// observeReport feeds one router's report about an owned function into its
// supervisor's window. The report has been checked (checkReport): every
// value is within its bound. A report with no load and no instances does
// not start a supervisor: an idle function needs none.
func (c *controller) observeReport(id *skipperv1.RouterIdentity, r wireReport, fr wireFunction, now time.Time) {
	key := fr.Key
	if !c.owns(key) {
		return
	}
	rep := scaling.Report{
		Router:    scaling.RouterID{Pod: id.GetPod(), Incarnation: id.GetIncarnation()},
		Sequence:  r.Sequence,
		Sent:      r.Sent,
		InFlight:  fr.InFlight,
		Queued:    fr.Queued,
		Counters:  fr.Counters,
		Instances: fr.Instances,
	}
	observe := func(s *supervisor) {
		s.mu.Lock()
		s.window.Observe(now, rep)
		s.mu.Unlock()
	}
	// A supervisor this report starts sees it on its first tick: fed after
	// the start, the first tick could find no load and stop it again.
	start := fr.InFlight > 0 || fr.Queued > 0 || len(fr.Instances) > 0
	if s, fresh := c.supervisorFor(key, start, observe); s != nil && !fresh {
		observe(s)
	}
}

// claimDone records a claim's outcome for status and Events.
func (c *controller) claimDone(fn *v1alpha1.Function, err error) {
	s, _ := c.supervisorFor(fn.Key(), false, nil)
	var msg string
	switch {
	case err == nil:
	case errors.Is(err, ErrPoolEmpty):
		msg = err.Error()
		c.event(fn, corev1.EventTypeWarning, "PoolExhausted", "%s", msg)
	case errors.Is(err, context.Canceled):
		return // shutting down
	default:
		c.event(fn, corev1.EventTypeWarning, "ClaimFailed", "%v", err)
		if s != nil {
			s.mu.Lock()
			if s.failures == 0 {
				s.backoff = doubling(c.cfg.ScaleInterval, maxClaimBackoff)
			}
			s.failures++
			failures := s.failures // read under the lock: concurrent claims end here too
			in := s.backoff.Step()
			s.retryAt = time.Now().Add(in)
			s.mu.Unlock()
			c.log.Warn("claim failed, scale-up backs off", "function", fn.Key(), "failures", failures, "retry_in", in, "err", err)
		}
		return
	}
	if s != nil {
		s.mu.Lock()
		s.exhausted = msg
		s.failures, s.retryAt = 0, time.Time{}
		s.mu.Unlock()
	}
}

// maxClaimBackoff bounds the scale-up back-off after failed claims.
const maxClaimBackoff = time.Minute

// run ticks every --scale-interval until a tick says stop or ctx ends.
// A tick's own work runs under ctx, not the loop's, which its stop ends.
func (s *supervisor) run(ctx context.Context) {
	loop, stop := context.WithCancel(ctx)
	defer stop()
	every := tick.Every
	if s.deferFirstTick {
		every = tick.After
	}
	every(loop, s.cfg.ScaleInterval, func(now time.Time) {
		if !s.tick(ctx, now) {
			stop()
		}
	})
}

func (c *controller) dropSupervisor(s *supervisor) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sups[s.key] == s {
		delete(c.sups, s.key)
	}
	c.log.Debug("supervisor stopped", "function", s.key)
}

// tick runs one pass and reports whether the supervisor goes on.
func (s *supervisor) tick(ctx context.Context, now time.Time) bool {
	in, ok := s.host.snapshot(s.key, now)
	if !ok {
		return false
	}
	fn := in.Function
	pol := planPolicyOf(fn, s.cfg)
	in.History, in.Draining = s.history, s.drains
	s.mu.Lock()
	in.Window = s.window
	p := decidePlan(in, pol, &s.buf)
	s.window.Prune(now, pol.HeartbeatTimeout)
	s.mu.Unlock()
	s.history = p.history
	s.apply(ctx, fn, &p, now)
	return p.keep
}

// apply carries out a plan: claims, withdrawals, deletions, metrics and
// status.
func (s *supervisor) apply(ctx context.Context, fn *v1alpha1.Function, p *plan, now time.Time) {
	h := s.host
	for _, pod := range p.retire {
		var reason string
		switch {
		case restartedSinceClaim(pod):
			reason = "its container restarted since it was claimed"
		case assignPending(pod):
			reason = "its assignment was never recorded (still marked " + annAssignPending + " " + assignGrace(s.cfg).String() + " after its claim)"
		default:
			reason = "its oneshot lease expired"
		}
		h.withdraw(fn, p.port, []*corev1.Pod{pod}, now, now.Add(assumedTTL))
		h.remove(ctx, pod, reason, now.Add(assumedTTL))
		h.event(fn, corev1.EventTypeWarning, "InstanceRetired", "instance %s retired: %s", pod.Name, reason)
	}
	d := p.decision
	s.mu.Lock()
	retryAt := s.retryAt
	s.mu.Unlock()
	if p.portErr == nil && int(d.Instances) > p.current && !fn.Spec.Oneshot && !now.Before(retryAt) {
		h.scaleUp(fn, p.port, int(d.Instances))
	}
	if len(p.victims) > 0 {
		pods := make([]*corev1.Pod, len(p.victims))
		for i, v := range p.victims {
			pods[i] = v.Pod
		}
		gen := h.withdraw(fn, p.port, pods, now, now.Add(s.cfg.DrainTimeout+assumedTTL))
		for _, pod := range pods {
			s.drains[pod.UID] = &drain{pod: pod, gen: gen, since: now}
			s.log.Info("draining instance", "function", s.key, "pod", pod.Name, "generation", gen)
		}
	}
	s.progressDrains(ctx, now)
	if len(p.reassign) > 0 && p.portErr == nil {
		h.reassign(fn, p.port, p.reassign)
	}
	if len(p.probe) > 0 && p.portErr == nil {
		h.probe(fn, p.port, p.probe)
	}

	if !fn.Spec.Oneshot && d.Instances != s.desired {
		dir := directionUp
		if d.Instances < s.desired {
			dir = directionDown
		}
		s.metrics.scaleDecisions.WithLabelValues(s.key, dir, string(d.Reason)).Inc()
		reason := "ScaledUp"
		if dir == directionDown {
			reason = "ScaledDown"
		}
		h.event(fn, corev1.EventTypeNormal, reason, "desired instances %d → %d (%s; in-flight %d, queued %d)",
			s.desired, d.Instances, d.Reason, p.load.InFlight, p.load.Queued)
		s.log.Info("scale", "function", s.key, "from", s.desired, "to", d.Instances, "reason", d.Reason,
			"in_flight", p.load.InFlight, "queued", p.load.Queued, "current", p.current)
		s.desired, s.reason, s.lastScale = d.Instances, string(d.Reason), now
	} else if fn.Spec.Oneshot {
		s.desired, s.reason = d.Instances, string(d.Reason)
	}
	s.view.Store(&supervisorView{desired: s.desired, reason: s.reason, inFlight: p.load.InFlight, queued: p.load.Queued})
	if counts := [...]int{p.ready, p.notReady, p.terminating, len(s.drains), p.pending}; counts != s.counts || s.rewrite.Swap(false) {
		// Written on change only: a labelled series lookup costs more than
		// the rest of a steady tick.
		s.counts = counts
		s.metrics.setInstances(s.key, map[string]int{
			stateReady: p.ready, stateNotReady: p.notReady, stateTerminating: p.terminating,
			stateDraining: len(s.drains), stateClaiming: p.pending,
		})
	}
	s.mu.Lock()
	exhausted := s.exhausted
	s.mu.Unlock()
	if err := h.writeStatus(ctx, fn, statusView{
		desired: s.desired, ready: int32(p.ready), reason: s.reason, lastScale: s.lastScale,
		exhausted: exhausted, poolErr: p.portErr,
	}, now); err != nil {
		s.log.Warn("status write failed", "function", s.key, "err", err)
	}
}
