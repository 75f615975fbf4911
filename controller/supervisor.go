package controller

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/scaling"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// supervisor is the goroutine that converges one owned Function: every
// --scale-interval it checks ownership, merges the routers' reports into a
// scaling.Window, asks scaling.Decide for the instance count, starts claims
// (scale-up), withdraws and drains instances (scale-down), retires
// instances whose container restarted, and writes status.
//
// A supervisor runs while this replica owns the function and the function
// needs one: always when minInstances > 0, otherwise from its first
// reference (a GetInstance, a report with load, a claimed pod) until it is
// idle with no instances. It stops itself on its first tick that finds the
// function gone, owned elsewhere, or idle and empty.
type supervisor struct {
	c   *controller
	key string
	// done is closed when run returns.
	done chan struct{}

	mu     sync.Mutex // guards window and the claim outcome: reports and claims arrive on other goroutines
	window *scaling.Window
	// exhausted says why the last claim found no pool pod; "" once a claim
	// succeeds.
	exhausted string
	// failures counts claims failed in a row for another reason than an
	// empty pool (the instance refused its assignment, the API failed);
	// scale-up waits until retryAt, backing off exponentially, so a function
	// whose instances never accept it does not churn through its pool.
	failures int
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
	rewrite    atomic.Bool
	instances  []scaling.Instance // reused between ticks
	candidates []victim           // reused between ticks
}

// supervisorView is a supervisor's last decision as GetState shows it.
type supervisorView struct {
	desired          int32
	reason           string
	inFlight, queued int64
}

func newSupervisor(c *controller, key string, fn *v1alpha1.Function, now time.Time) *supervisor {
	s := &supervisor{
		c: c, key: key, done: make(chan struct{}),
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
	s := newSupervisor(c, key, fn, now)
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
	c.wg.Go(func() { s.run(c.runCtx) })
	return s, true
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
			s.failures++
			wait := min(c.cfg.ScaleInterval<<min(s.failures-1, 16), maxClaimBackoff)
			s.retryAt = time.Now().Add(wait)
			s.mu.Unlock()
			c.log.Warn("claim failed, scale-up backs off", "function", fn.Key(), "failures", s.failures, "retry_in", wait, "err", err)
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

// assignGrace is how long after its claim a pod may stay marked
// assign-pending before it is retired (see assignStale).
func (c *controller) assignGrace() time.Duration {
	return c.cfg.ClaimTimeout + 2*c.cfg.AssignTimeout
}

// maxClaimBackoff bounds the scale-up back-off after failed claims.
const maxClaimBackoff = time.Minute

func (s *supervisor) run(ctx context.Context) {
	defer close(s.done)
	defer s.c.dropSupervisor(s)
	t := time.NewTicker(s.c.cfg.ScaleInterval)
	defer t.Stop()
	for wait := s.deferFirstTick; ; wait = true {
		if wait {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		if !s.tick(ctx, time.Now()) {
			return
		}
	}
}

func (c *controller) dropSupervisor(s *supervisor) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sups[s.key] == s {
		delete(c.sups, s.key)
	}
	c.log.Debug("supervisor stopped", "function", s.key)
}

// plan is what one tick decided, before any of it is carried out.
type plan struct {
	port     int32
	portErr  error
	decision scaling.Decision
	// current is the expected instance count: observed, assumed and in
	// flight, less those withdrawn.
	current     int
	pending     int
	ready       int
	notReady    int
	terminating int
	victims     []victim
	retire      []*corev1.Pod // restarted, or oneshot past its lease
	inFlight    int64
	load        scaling.Load
	keep        bool
}

// tick runs one pass and reports whether the supervisor goes on.
func (s *supervisor) tick(ctx context.Context, now time.Time) bool {
	c := s.c
	ns, name, _ := splitKey(s.key)
	fn, err := c.cache.function(ns, name)
	if err != nil || fn.DeletionTimestamp != nil {
		return false
	}
	if !c.owns(s.key) {
		c.log.Info("ownership moved, supervisor stops", "function", s.key, "owner", c.owner(s.key))
		return false
	}
	p := s.plan(fn, now)
	s.apply(ctx, fn, &p, now)
	return p.keep
}

// policy maps a Function's spec and the controller's settings to a scaling
// policy.
func (c *controller) policy(fn *v1alpha1.Function) scaling.Policy {
	stab := c.cfg.ScaleDownStabilization
	if stab == 0 {
		stab = -1 // zero in the config means none; zero in a Policy means the default
	}
	return scaling.Policy{
		MinInstances:        fn.Spec.MinInstances,
		MaxInstances:        fn.Spec.MaxInstances,
		TargetInFlight:      targetInFlight(&fn.Spec),
		TargetCPUMilli:      fn.Spec.Scaling.TargetCPUMilli,
		TargetMemoryMiB:     fn.Spec.Scaling.TargetMemoryMiB,
		IdleTimeout:         fn.Spec.IdleTimeoutOrDefault(),
		StabilizationWindow: stab,
		MetricWindow:        c.cfg.ReportInterval,
	}
}

// targetInFlight is the in-flight (plus queued) target per instance: the
// spec's, but never above its concurrencyLimit. An instance never holds
// more than its limit, so with a higher target the excess waits in the
// routers' queues and the function would never scale on it.
func targetInFlight(spec *v1alpha1.FunctionSpec) int32 {
	t := spec.TargetInFlight()
	if l := spec.ConcurrencyLimit; l > 0 && l < t {
		return l
	}
	return t
}

// plan reads the caches, the claims and the window, and decides. It writes
// nothing but the supervisor's own history.
func (s *supervisor) plan(fn *v1alpha1.Function, now time.Time) plan {
	c := s.c
	var p plan
	p.port, p.portErr = c.port(fn)
	pods := c.cache.functionPods(fn.Namespace, fn.Name)
	hb := c.cfg.HeartbeatTimeout

	s.mu.Lock()
	defer s.mu.Unlock()
	s.instances, s.candidates = s.instances[:0], s.candidates[:0]
	add := func(pod *corev1.Pod) {
		at := claimedAt(pod)
		if restartedSinceClaim(pod) || (fn.Spec.Oneshot && !at.IsZero() && now.Sub(at) >= c.cfg.OneshotLease) ||
			assignStale(pod, now, c.assignGrace()) {
			if _, draining := s.drains[pod.UID]; !draining {
				p.retire = append(p.retire, pod)
			}
			return
		}
		// A pod still marked assign-pending serves nothing yet: another
		// claim is assigning it.
		inst := scaling.Instance{Ready: podReady(pod) && !assignPending(pod), ReadyChanged: readySince(pod)}
		if pod.Status.StartTime != nil {
			inst.Started = pod.Status.StartTime.Time
		}
		s.window.Fill(now, hb, string(pod.UID), &inst)
		if inst.Ready {
			p.ready++
		} else {
			p.notReady++
		}
		s.instances = append(s.instances, inst)
		s.candidates = append(s.candidates, victim{Pod: pod, Ready: inst.Ready, InFlight: inst.InFlight, ClaimedAt: at})
	}
	cl := c.claims
	cl.mu.Lock()
	assumed := cl.assumedLocked(fn.Key(), pods, now)
	for _, pod := range pods {
		switch {
		case pod.Labels[v1alpha1.LabelFunction] != fn.Name || !ownedBy(pod, fn):
		case containsPod(assumed, pod.UID):
			// The cache shows it still marked assign-pending, but this
			// replica recorded its assignment: added below, once, as assumed.
		case pod.DeletionTimestamp != nil:
			p.terminating++
		case cl.reserved[pod.UID]:
			// A flight is claiming it: counted below as that flight, and
			// never a scale-down victim.
		case !cl.retiredLocked(pod.UID, now):
			add(pod) // restarted ones too: add sends them to retire
		}
	}
	for _, pod := range assumed {
		if !cl.retiredLocked(pod.UID, now) {
			add(pod)
		}
	}
	p.pending = len(cl.flights[fn.Key()])
	cl.mu.Unlock()
	for range p.pending {
		s.instances = append(s.instances, scaling.Instance{}) // expected: not ready, not started
	}
	p.current = len(s.instances)
	p.load = s.window.Load(now, hb)
	s.window.Prune(now, hb)

	if fn.Spec.Oneshot {
		// Each instance belongs to one call: nothing to scale.
		p.decision = scaling.Decision{Instances: int32(p.current), Reason: "oneshot"}
		p.keep = p.current > 0 || len(s.drains) > 0
		return p
	}
	in := scaling.Input{
		Now:        now,
		Instances:  s.instances,
		InFlight:   p.load.InFlight,
		Queued:     p.load.Queued,
		LastActive: s.window.LastActive(),
		History:    s.history,
		WarmedUp:   s.window.WarmedUp(now, hb),
	}
	p.decision = scaling.Decide(in, c.policy(fn))
	s.history = p.decision.History
	if int(p.decision.Instances) < p.current && p.portErr == nil {
		p.victims = pickVictims(s.candidates, p.current-int(p.decision.Instances))
	}
	p.keep = fn.Spec.MinInstances > 0 || p.current > 0 || len(s.drains) > 0 || p.decision.Instances > 0
	return p
}

// apply carries out a plan: claims, withdrawals, deletions, metrics and
// status.
func (s *supervisor) apply(ctx context.Context, fn *v1alpha1.Function, p *plan, now time.Time) {
	c := s.c
	for _, pod := range p.retire {
		var reason string
		switch {
		case restartedSinceClaim(pod):
			reason = "its container restarted since it was claimed"
		case assignPending(pod):
			reason = "its assignment was never recorded (still marked " + annAssignPending + " " + c.assignGrace().String() + " after its claim)"
		default:
			reason = "its oneshot lease expired"
		}
		c.withdraw(fn, p.port, []*corev1.Pod{pod}, now, now.Add(assumedTTL))
		c.deletePod(ctx, pod, reason)
		c.event(fn, corev1.EventTypeWarning, "InstanceRetired", "instance %s retired: %s", pod.Name, reason)
	}
	d := p.decision
	s.mu.Lock()
	retryAt := s.retryAt
	s.mu.Unlock()
	if p.portErr == nil && int(d.Instances) > p.current && !fn.Spec.Oneshot && !now.Before(retryAt) {
		c.scaleUp(fn, p.port, int(d.Instances))
	}
	if len(p.victims) > 0 {
		pods := make([]*corev1.Pod, len(p.victims))
		for i, v := range p.victims {
			pods[i] = v.Pod
		}
		gen := c.withdraw(fn, p.port, pods, now, now.Add(c.cfg.DrainTimeout+assumedTTL))
		for _, pod := range pods {
			s.drains[pod.UID] = &drain{pod: pod, gen: gen, since: now}
			c.log.Info("draining instance", "function", s.key, "pod", pod.Name, "generation", gen)
		}
	}
	s.progressDrains(ctx, now)

	if !fn.Spec.Oneshot && d.Instances != s.desired {
		dir := directionUp
		if d.Instances < s.desired {
			dir = directionDown
		}
		c.metrics.scaleDecisions.WithLabelValues(s.key, dir, string(d.Reason)).Inc()
		reason := "ScaledUp"
		if dir == directionDown {
			reason = "ScaledDown"
		}
		c.event(fn, corev1.EventTypeNormal, reason, "desired instances %d → %d (%s; in-flight %d, queued %d)",
			s.desired, d.Instances, d.Reason, p.load.InFlight, p.load.Queued)
		c.log.Info("scale", "function", s.key, "from", s.desired, "to", d.Instances, "reason", d.Reason,
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
		c.metrics.setInstances(s.key, map[string]int{
			stateReady: p.ready, stateNotReady: p.notReady, stateTerminating: p.terminating,
			stateDraining: len(s.drains), stateClaiming: p.pending,
		})
	}
	s.mu.Lock()
	exhausted := s.exhausted
	s.mu.Unlock()
	if err := c.writeStatus(ctx, fn, statusView{
		desired: s.desired, ready: int32(p.ready), reason: s.reason, lastScale: s.lastScale,
		exhausted: exhausted, poolErr: p.portErr,
	}, now); err != nil {
		c.log.Warn("status write failed", "function", s.key, "err", err)
	}
}
