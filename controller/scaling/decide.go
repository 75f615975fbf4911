package scaling

import (
	"math"
	"time"
)

// Defaults applied to zero Policy fields.
const (
	// DefaultTolerance is HPA's --horizontal-pod-autoscaler-tolerance.
	DefaultTolerance = 0.1
	// DefaultStabilizationWindow is HPA's scale-down stabilization window.
	DefaultStabilizationWindow = 300 * time.Second
	// DefaultCPUInitializationPeriod is HPA's
	// --horizontal-pod-autoscaler-cpu-initialization-period.
	DefaultCPUInitializationPeriod = 5 * time.Minute
	// DefaultInitialReadinessDelay is HPA's
	// --horizontal-pod-autoscaler-initial-readiness-delay.
	DefaultInitialReadinessDelay = 30 * time.Second
)

// Reason says which metric or rule set a Decision's instance count.
type Reason string

// Reasons, as they appear in Function status and metric labels.
const (
	// ReasonInFlight: in-flight plus queued requests per instance.
	ReasonInFlight Reason = "inFlight"
	// ReasonCPU: average CPU per instance.
	ReasonCPU Reason = "cpu"
	// ReasonMemory: average memory per instance.
	ReasonMemory Reason = "memory"
	// ReasonMinInstances: the recommendation was below MinInstances.
	ReasonMinInstances Reason = "minInstances"
	// ReasonMaxInstances: the recommendation was above MaxInstances.
	ReasonMaxInstances Reason = "maxInstances"
	// ReasonActive: MinInstances is 0 and the recommendation was 0, but the
	// function is not idle yet, so one instance stays.
	ReasonActive Reason = "active"
	// ReasonIdle: scaled to zero after IdleTimeout without activity.
	ReasonIdle Reason = "idle"
	// ReasonStabilized: a scale-down held by the stabilization window.
	ReasonStabilized Reason = "stabilized"
	// ReasonOwnerWarmup: a scale-down held because this owner has not seen a
	// full heartbeat window yet.
	ReasonOwnerWarmup Reason = "ownerWarmup"
	// ReasonNoMetrics: no metric gave a recommendation; the count stays.
	ReasonNoMetrics Reason = "noMetrics"
)

// Policy is a function's scaling policy: its spec, with the controller's
// settings. A zero StabilizationWindow, Tolerance, CPUInitializationPeriod
// or InitialReadinessDelay takes the default above; a negative one means
// none (no window, no tolerance, no period).
type Policy struct {
	// MinInstances and MaxInstances bound the result (spec.minInstances,
	// spec.maxInstances). MaxInstances below max(MinInstances, 1) is read
	// as that (the API server rejects such specs).
	MinInstances, MaxInstances int32
	// TargetInFlight is in-flight plus queued requests per instance; 0
	// leaves the metric out (callers pass spec.TargetInFlight(), which
	// applies the default 10).
	TargetInFlight int32
	// TargetCPUMilli is the average CPU per instance in millicores; 0 leaves
	// CPU out.
	TargetCPUMilli int32
	// TargetMemoryMiB is the average memory per instance in MiB; 0 leaves
	// memory out.
	TargetMemoryMiB int32
	// IdleTimeout without activity after which a function with
	// MinInstances 0 scales to zero (callers pass
	// spec.IdleTimeoutOrDefault()). Zero means at once; no default applies.
	IdleTimeout time.Duration
	// StabilizationWindow over which scale-down takes the highest
	// recommendation. Zero: DefaultStabilizationWindow.
	StabilizationWindow time.Duration
	// Tolerance around a usage/target ratio of 1 within which CPU and
	// memory recommend no change. Zero: DefaultTolerance.
	Tolerance float64
	// CPUInitializationPeriod after an instance started during which its CPU
	// sample counts only once it covers a ready instance. Zero:
	// DefaultCPUInitializationPeriod.
	CPUInitializationPeriod time.Duration
	// InitialReadinessDelay after an instance started within which a not
	// ready instance counts as never having been ready. Zero:
	// DefaultInitialReadinessDelay.
	InitialReadinessDelay time.Duration
	// MetricWindow is the span one CPU sample covers (the routers' report
	// interval): a sample taken less than this after the instance became
	// ready may include its start-up. Zero: samples postdate readiness.
	MetricWindow time.Duration
}

// Instance is one instance the function holds, as the caller sees it now.
// Terminating instances are left out by the caller; claims it expects but
// has not observed are passed as not ready with zero Started.
type Instance struct {
	// Ready reports whether the instance serves (assigned and Ready).
	Ready bool
	// Started is when the instance started as this function's instance
	// (HPA: the pod's start time); zero means not started (HPA: Pending),
	// which leaves it out of every metric.
	Started time.Time
	// ReadyChanged is the last transition of readiness (HPA: the Ready
	// condition's lastTransitionTime): when it became ready if Ready, when
	// it became not ready otherwise; zero if unknown.
	ReadyChanged time.Time
	// InFlight is the requests in flight on this instance across routers.
	// The in-flight metric uses Input's aggregate (which also counts queued
	// requests no instance holds yet); this is carried for observability.
	InFlight int64
	// CPUMilli is the CPU use in millicores; valid only if HasCPU.
	CPUMilli int64
	HasCPU   bool
	// MemoryBytes is the memory use; valid only if HasMemory.
	MemoryBytes int64
	HasMemory   bool
}

// Input is everything a decision depends on.
type Input struct {
	Now time.Time
	// Instances the function holds; the current count is len(Instances).
	Instances []Instance
	// InFlight and Queued are the routers' aggregate gauges.
	InFlight, Queued int64
	// LastActive is the last time a request was in flight or queued (or a
	// request completed); zero means never, which counts as idle.
	LastActive time.Time
	// History is what the previous Decision returned; the zero History for
	// a function this owner just took over.
	History History
	// WarmedUp reports whether this owner has seen one full heartbeat window
	// for the function; before that, Decide never scales down.
	WarmedUp bool
}

// Recommendation is one metric's view, for observability.
type Recommendation struct {
	// Valid is false when the metric is disabled or had no samples.
	Valid bool
	// Instances the metric alone asks for, before clamping.
	Instances int32
	// Ratio of the average usage per counted instance to the target, as
	// first computed (before missing and not-ready instances are filled in);
	// for in-flight, over max(current, 1) instances.
	Ratio float64
}

// Recommendations holds each metric's view.
type Recommendations struct {
	InFlight, CPU, Memory Recommendation
}

// Decision is what Decide returns.
type Decision struct {
	// Instances is the count to converge to.
	Instances int32
	// Reason names the metric or rule that set Instances.
	Reason Reason
	// Recommended is the clamped recommendation before stabilization and
	// owner warm-up: what the history recorded.
	Recommended int32
	// Metrics is each metric's recommendation.
	Metrics Recommendations
	// History to pass to the next call.
	History History
}

// Decide returns the instance count to converge to. No I/O, no clock (the
// caller passes in.Now), no hidden state, no allocations. It is the
// Kubernetes HorizontalPodAutoscaler's replica calculation per metric,
// combined the way HPA combines them:
//
//   - CPU and memory (per-instance averages): desired = ceil(n × usage/target)
//     with a tolerance (default 0.1: no change while |usage/target − 1| ≤ 0.1).
//     Instances without a sample count as using the target on a scale-down
//     and nothing on a scale-up; for CPU, instances that are not yet ready
//     (or whose sample may predate readiness) count as using nothing on a
//     scale-up and are left out of a scale-down. A recommendation that would
//     flip direction once those assumptions are applied is dropped.
//   - In-flight: desired = ceil((in-flight + queued) / target), from the
//     routers' aggregate, without tolerance, so any load on zero instances
//     asks for at least one.
//   - The largest recommendation wins; a zero target leaves its metric out.
//   - The result is clamped to [MinInstances, MaxInstances]; with
//     MinInstances 0 an instance stays while the function is active.
//   - Scale-up applies at once. Scale-down goes only to the highest
//     recommendation within the stabilization window (HPA's default 300s).
//   - Scale to zero happens only when MinInstances is 0, nothing is in flight
//     or queued and IdleTimeout has passed since the last activity; it is not
//     held by the stabilization window (IdleTimeout is its own hold).
//   - An owner that has not yet seen one full heartbeat window never scales
//     down (its view of the load may be partial).
//
// The history is bounded and, when it must drop detail, keeps the higher
// value for longer, so it may hold a scale-down longer than HPA would but
// never releases it earlier.
func Decide(in Input, p Policy) Decision {
	p = p.withDefaults()
	current := int32(len(in.Instances))
	load := max(in.InFlight, 0)
	if q := max(in.Queued, 0); load > math.MaxInt64-q {
		load = math.MaxInt64
	} else {
		load += q
	}
	d := Decision{History: in.History}

	d.Metrics.InFlight = inFlightRecommendation(load, current, p.TargetInFlight)
	d.Metrics.CPU = resourceRecommendation(&in, &p, p.TargetCPUMilli != 0, float64(p.TargetCPUMilli), cpuSample, true)
	d.Metrics.Memory = resourceRecommendation(&in, &p, p.TargetMemoryMiB != 0, float64(p.TargetMemoryMiB)*(1<<20), memorySample, false)

	if p.MinInstances == 0 && load == 0 && in.Now.Sub(in.LastActive) >= p.IdleTimeout {
		d.Recommended = 0
		d.History.record(in.Now, 0, p.StabilizationWindow)
		d.Instances, d.Reason = 0, ReasonIdle
		if !in.WarmedUp && current > 0 {
			d.Instances, d.Reason = min(current, p.MaxInstances), ReasonOwnerWarmup
		}
		return d
	}

	// The largest recommendation wins; ties go to the first in this order.
	rec, reason := current, ReasonNoMetrics
	found := false
	for _, m := range [...]struct {
		r      Recommendation
		reason Reason
	}{{d.Metrics.InFlight, ReasonInFlight}, {d.Metrics.CPU, ReasonCPU}, {d.Metrics.Memory, ReasonMemory}} {
		if m.r.Valid && (!found || m.r.Instances > rec) {
			rec, reason, found = m.r.Instances, m.reason, true
		}
	}

	lo, loReason := p.MinInstances, ReasonMinInstances
	if lo == 0 && (current > 0 || load > 0) {
		lo, loReason = 1, ReasonActive
	}
	hi := p.MaxInstances
	switch {
	case rec < lo:
		rec, reason = lo, loReason
	case rec > hi:
		rec, reason = hi, ReasonMaxInstances
	}
	d.Recommended = rec
	// HPA's stabilization with a zero scale-up window: up to rec at once,
	// down only to the highest recommendation in the window (which the
	// bounds may have lowered since it was recorded).
	highest := min(d.History.record(in.Now, rec, p.StabilizationWindow), hi)
	d.Instances, d.Reason = current, reason
	switch {
	case rec > current:
		d.Instances = rec
	case current > highest:
		d.Instances = highest
		if highest > rec {
			d.Reason = ReasonStabilized
		}
	case rec < current:
		d.Reason = ReasonStabilized
	}
	// Warm-up holds what the load might still need, not more than the spec
	// now allows.
	if hold := min(current, hi); !in.WarmedUp && d.Instances < hold {
		d.Instances, d.Reason = hold, ReasonOwnerWarmup
	}
	return d
}

func (p Policy) withDefaults() Policy {
	dur := func(d *time.Duration, def time.Duration) {
		switch {
		case *d == 0:
			*d = def
		case *d < 0:
			*d = 0
		}
	}
	dur(&p.StabilizationWindow, DefaultStabilizationWindow)
	dur(&p.CPUInitializationPeriod, DefaultCPUInitializationPeriod)
	dur(&p.InitialReadinessDelay, DefaultInitialReadinessDelay)
	switch {
	case p.Tolerance == 0:
		p.Tolerance = DefaultTolerance
	case p.Tolerance < 0 || math.IsNaN(p.Tolerance):
		p.Tolerance = 0
	}
	p.MinInstances = max(p.MinInstances, 0)
	p.MaxInstances = max(p.MaxInstances, p.MinInstances, 1)
	p.TargetInFlight = max(p.TargetInFlight, 0)
	p.TargetCPUMilli = max(p.TargetCPUMilli, 0)
	p.TargetMemoryMiB = max(p.TargetMemoryMiB, 0)
	return p
}

// inFlightRecommendation is ceil(load / target): no tolerance, so any load
// on zero instances asks for one.
func inFlightRecommendation(load int64, current, target int32) Recommendation {
	if target == 0 {
		return Recommendation{}
	}
	want := load / int64(target)
	if load%int64(target) != 0 {
		want++
	}
	return Recommendation{
		Valid:     true,
		Instances: int32(min(want, math.MaxInt32)),
		Ratio:     float64(load) / float64(target) / float64(max(current, 1)),
	}
}

func cpuSample(i *Instance) (int64, bool)    { return i.CPUMilli, i.HasCPU }
func memorySample(i *Instance) (int64, bool) { return i.MemoryBytes, i.HasMemory }

// resourceRecommendation is HPA's calcPlainMetricReplicas for an
// average-value target (pkg/controller/podautoscaler/replica_calculator.go),
// with its groupPods classification.
func resourceRecommendation(in *Input, p *Policy, enabled bool, target float64, sample func(*Instance) (int64, bool), cpu bool) Recommendation {
	if !enabled {
		return Recommendation{}
	}
	current := int32(len(in.Instances))
	var ready, unready, missing int64
	var sum float64
	for i := range in.Instances {
		inst := &in.Instances[i]
		if inst.Started.IsZero() { // HPA: Pending pods are unready for every metric.
			unready++
			continue
		}
		v, ok := sample(inst)
		if !ok {
			missing++
			continue
		}
		if cpu && cpuUnready(inst, in.Now, p) {
			unready++
			continue
		}
		ready++
		sum += float64(max(v, 0))
	}
	if ready == 0 { // HPA: "did not receive metrics for targeted pods"
		return Recommendation{}
	}
	ratio := sum / (float64(ready) * target)
	r := Recommendation{Valid: true, Ratio: ratio, Instances: current}
	scaleUpWithUnready := unready > 0 && ratio > 1
	if !scaleUpWithUnready && missing == 0 {
		if !within(ratio, p.Tolerance) {
			r.Instances = ceilInstances(ratio * float64(ready))
		}
		return r
	}
	// Missing samples count as the target on a scale-down and as nothing on
	// a scale-up; unready instances count as nothing on a scale-up.
	n := ready + missing
	if ratio < 1 {
		sum += float64(missing) * target
	}
	if scaleUpWithUnready {
		n += unready
	}
	newRatio := sum / (float64(n) * target)
	if within(newRatio, p.Tolerance) || (ratio < 1 && newRatio > 1) || (ratio > 1 && newRatio < 1) {
		return r
	}
	want := ceilInstances(newRatio * float64(n))
	if (newRatio < 1 && want > current) || (newRatio > 1 && want < current) {
		return r
	}
	r.Instances = want
	return r
}

// within reports whether ratio is within tolerance of 1, inclusive. The
// slack absorbs float rounding: |1 − 110/100| is 0.10000000000000009, and a
// usage exactly 10% over target must count as within a 0.1 tolerance.
func within(ratio, tolerance float64) bool { return math.Abs(1-ratio) <= tolerance+1e-9 }

// cpuUnready is HPA's groupPods test for CPU samples.
func cpuUnready(i *Instance, now time.Time, p *Policy) bool {
	if i.Started.Add(p.CPUInitializationPeriod).After(now) {
		// Within initialization: the sample counts once it covers a ready
		// instance only.
		return !i.Ready || now.Before(i.ReadyChanged.Add(p.MetricWindow))
	}
	// Afterwards: ignored only if not ready and never ready since start.
	return !i.Ready && i.Started.Add(p.InitialReadinessDelay).After(i.ReadyChanged)
}

func ceilInstances(x float64) int32 {
	c := math.Ceil(x)
	if c >= math.MaxInt32 || math.IsNaN(c) {
		return math.MaxInt32
	}
	return int32(max(c, 0))
}
