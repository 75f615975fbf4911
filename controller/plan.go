package controller

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/scaling"
)

// planInput is the snapshot one supervisor tick decides from: the
// controller's part (supervisorHost.snapshot) and the supervisor's own
// (its window, history and drains).
type planInput struct {
	Now      time.Time
	Function *v1alpha1.Function
	// Port is the function's instance port; PortErr says why there is none
	// (its pool is missing), and then nothing is withdrawn.
	Port    int32
	PortErr error
	// Pods are the cache's pods labelled for the function.
	Pods []*corev1.Pod
	// Claims are this replica's claims of the function, read after Pods.
	Claims claimView
	// Window holds the routers' reports; it is only read.
	Window *scaling.Window
	// History is what the last decision kept (scaling.Decision.History).
	History scaling.History
	// Draining are the instances withdrawn and not yet deleted.
	Draining map[types.UID]*drain
}

// planPolicy is what a plan follows besides its snapshot.
type planPolicy struct {
	Scaling scaling.Policy
	// HeartbeatTimeout is how long a router's report counts
	// (--heartbeat-timeout); OneshotLease how long a oneshot instance
	// lives (--oneshot-lease); AssignGrace how long a pod may stay marked
	// assign-pending (assignGrace).
	HeartbeatTimeout, OneshotLease, AssignGrace time.Duration
}

// planPolicyOf is the plan policy of fn under cfg.
func planPolicyOf(fn *v1alpha1.Function, cfg *Config) planPolicy {
	stab := cfg.ScaleDownStabilization
	if stab == 0 {
		stab = -1 // zero in the config means none; zero in a Policy means the default
	}
	return planPolicy{
		Scaling: scaling.Policy{
			MinInstances:        fn.Spec.MinInstances,
			MaxInstances:        fn.Spec.MaxInstances,
			TargetInFlight:      targetInFlight(&fn.Spec),
			TargetCPUMilli:      fn.Spec.Scaling.TargetCPUMilli,
			TargetMemoryMiB:     fn.Spec.Scaling.TargetMemoryMiB,
			IdleTimeout:         fn.Spec.IdleTimeoutOrDefault(),
			StabilizationWindow: stab,
			MetricWindow:        cfg.ReportInterval,
		},
		HeartbeatTimeout: cfg.HeartbeatTimeout,
		OneshotLease:     cfg.OneshotLease,
		AssignGrace:      assignGrace(cfg),
	}
}

// assignGrace is how long after its claim a pod may stay marked
// assign-pending before it is retired (see assignStale).
func assignGrace(cfg *Config) time.Duration {
	return cfg.ClaimTimeout + 2*cfg.AssignTimeout
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

// plan is what one tick decided, before any of it is carried out.
type plan struct {
	port     int32
	portErr  error
	decision scaling.Decision
	history  scaling.History // for the next tick
	// current is the expected instance count: observed, assumed and in
	// flight, less those withdrawn.
	current     int
	pending     int
	ready       int
	notReady    int
	terminating int
	victims     []victim
	retire      []*corev1.Pod // restarted, never recorded, or oneshot past its lease
	reassign    []*corev1.Pod // instances assigned with callers the function no longer has
	// probe are pod UIDs routers report as instances of the function that
	// are no instance of it here: maybe a claim whose record never landed
	// (its controller died between the assign and the record). Their
	// instances are asked what they hold, and adopted if they hold one.
	probe []types.UID
	load  scaling.Load
	keep  bool
}

// planBuffers are slices a supervisor reuses from tick to tick, so a
// steady tick allocates little; the zero value works.
type planBuffers struct {
	instances  []scaling.Instance
	candidates []victim
	reported   []string
}

// probeBatch bounds the reported pods one tick asks about.
const probeBatch = 4

// decidePlan decides one tick from in: which instances to retire, the
// scaling decision (scaling.Decide; a oneshot function is not scaled),
// the victims of a scale-down, the counts for metrics and status, and
// whether the supervisor goes on. It reads in, writes only buf, and does
// no I/O.
//
// A pod counts once: as assumed when this replica's claim of it is not
// yet shown recorded, as its flight while a claim is assigning it
// (reserved), not at all while retired (withdrawn, deleted).
func decidePlan(in planInput, pol planPolicy, buf *planBuffers) plan {
	fn, now, hb := in.Function, in.Now, pol.HeartbeatTimeout
	p := plan{port: in.Port, portErr: in.PortErr, history: in.History}
	buf.instances, buf.candidates = buf.instances[:0], buf.candidates[:0]
	add := func(pod *corev1.Pod) {
		at := claimedAt(pod)
		if restartedSinceClaim(pod) || (fn.Spec.Oneshot && !at.IsZero() && now.Sub(at) >= pol.OneshotLease) ||
			assignStale(pod, now, pol.AssignGrace) {
			if _, draining := in.Draining[pod.UID]; !draining {
				p.retire = append(p.retire, pod)
			}
			return
		}
		// A pod still marked assign-pending serves nothing yet: another
		// claim is assigning it.
		inst := scaling.Instance{Ready: v1alpha1.PodReady(pod) && !assignPending(pod), ReadyChanged: readySince(pod)}
		if pod.Status.StartTime != nil {
			inst.Started = pod.Status.StartTime.Time
		}
		in.Window.Fill(now, hb, string(pod.UID), &inst)
		if inst.Ready {
			p.ready++
		} else {
			p.notReady++
		}
		buf.instances = append(buf.instances, inst)
		buf.candidates = append(buf.candidates, victim{Pod: pod, Ready: inst.Ready, InFlight: inst.InFlight, ClaimedAt: at})
	}
	cl := in.Claims
	for _, pod := range in.Pods {
		switch {
		case pod.Labels[v1alpha1.LabelFunction] != fn.Name || !ownedBy(pod, fn):
		case containsPod(cl.Assumed, pod.UID):
			// The cache shows it still marked assign-pending, but this
			// replica recorded its assignment: added below, once, as assumed.
		case pod.DeletionTimestamp != nil:
			p.terminating++
		case slices.Contains(cl.Reserved, pod.UID):
			// A flight is claiming it: counted below as that flight, and
			// never a scale-down victim.
		case !slices.Contains(cl.Retired, pod.UID):
			add(pod) // restarted ones too: add sends them to retire
		}
	}
	for _, pod := range cl.Assumed {
		if !slices.Contains(cl.Retired, pod.UID) {
			add(pod)
		}
	}
	p.pending = cl.InFlight
	for range p.pending {
		buf.instances = append(buf.instances, scaling.Instance{}) // expected: not ready, not started
	}
	p.current = len(buf.instances)
	p.load = in.Window.Load(now, hb)
	buf.reported = in.Window.Reported(now, hb, buf.reported[:0])
	for _, uid := range buf.reported {
		u := types.UID(uid)
		if len(p.probe) == probeBatch {
			break
		}
		if !containsPod(in.Pods, u) && !containsPod(cl.Assumed, u) && !slices.Contains(cl.Reserved, u) && !slices.Contains(cl.Retired, u) {
			p.probe = append(p.probe, u)
		}
	}
	for _, pod := range staleCallers(fn, in.Pods) {
		if _, draining := in.Draining[pod.UID]; !draining && !slices.Contains(cl.Retired, pod.UID) &&
			!slices.Contains(cl.Reserved, pod.UID) && !slices.Contains(p.retire, pod) {
			p.reassign = append(p.reassign, pod)
		}
	}

	if fn.Spec.Oneshot {
		// Each instance belongs to one call: nothing to scale.
		p.decision = scaling.Decision{Instances: int32(p.current), Reason: "oneshot"}
		p.keep = p.current > 0 || len(in.Draining) > 0
		return p
	}
	p.decision = scaling.Decide(scaling.Input{
		Now:        now,
		Instances:  buf.instances,
		InFlight:   p.load.InFlight,
		Queued:     p.load.Queued,
		LastActive: in.Window.LastActive(),
		History:    in.History,
		WarmedUp:   in.Window.WarmedUp(now, hb),
	}, pol.Scaling)
	p.history = p.decision.History
	if int(p.decision.Instances) < p.current && p.portErr == nil {
		p.victims = pickVictims(buf.candidates, p.current-int(p.decision.Instances))
	}
	p.keep = fn.Spec.MinInstances > 0 || p.current > 0 || len(in.Draining) > 0 || p.decision.Instances > 0
	return p
}
