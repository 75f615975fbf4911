package scaling

import (
	"fmt"
	"math"
	"time"
)

// Defaults of the pool autoscaler (issue 15, item 6), for zero PoolInput
// fields.
const (
	// DefaultPoolWindow is how far back claims count toward the rate.
	DefaultPoolWindow = 30 * time.Second
	// DefaultPoolReadyTime stands in for the measured time a new pool pod
	// takes to become ready until one has been measured.
	DefaultPoolReadyTime = time.Second
	// DefaultPoolHeadroom is the ready pods kept beyond those the rate
	// needs.
	DefaultPoolHeadroom = 1
)

// PoolReason says what set a pool's replica count.
type PoolReason string

// Pool reasons, as they appear in Events.
const (
	// PoolReasonDemand: claims over the window times the ready time, plus
	// headroom.
	PoolReasonDemand PoolReason = "demand"
	// PoolReasonMin and PoolReasonMax: the demand was outside
	// skipper.dev/pool-min or skipper.dev/pool-max.
	PoolReasonMin PoolReason = "poolMin"
	PoolReasonMax PoolReason = "poolMax"
	// PoolReasonDry: no pod ready while claims came; grown by the claims.
	PoolReasonDry PoolReason = "dry"
	// PoolReasonStabilized: a scale-down held by a higher count decided
	// within the window.
	PoolReasonStabilized PoolReason = "stabilized"
	// PoolReasonUnrecorded: a scale-down held while the pool has claimed
	// pods whose record has not landed (the ReplicaSet still counts them
	// and cannot tell them from warm pods).
	PoolReasonUnrecorded PoolReason = "unrecorded"
)

// PoolInput is what a pool's replica count is decided from.
type PoolInput struct {
	Now time.Time
	// Claims are when the pool's pods were claimed; those before
	// Now-Window are ignored.
	Claims []time.Time
	// Window is how far back claims count (0: DefaultPoolWindow).
	Window time.Duration
	// ReadyTime is how long a new pool pod takes to become ready (0:
	// DefaultPoolReadyTime).
	ReadyTime time.Duration
	// Headroom is the ready pods kept beyond the demand (negative: 0; the
	// caller applies DefaultPoolHeadroom for an unset annotation).
	Headroom int32
	// Min and Max bound the result (skipper.dev/pool-min, pool-max; the
	// caller applies their defaults); Max below Min is read as Min.
	Min, Max int32
	// Recent are the counts demand asked for (PoolDecision.Demand) at
	// earlier decisions; those within the window hold a scale-down, so the
	// pool shrinks back only a window after its peak and does not flap as
	// the rate moves around a step.
	Recent []PoolPoint
	// LastUp is when the replicas last went up (zero: never).
	LastUp time.Time
	// Replicas is the Deployment's spec.replicas now.
	Replicas int32
	// Ready is the pool's ready, unclaimed pods; Unrecorded the pods
	// claimed but not yet recorded, which the Deployment's selector still
	// matches.
	Ready, Unrecorded int32
	// Asked are when the pods on their way (claims' replacements and
	// scale-ups not yet seen ready) were asked for. Those asked within two
	// ready times hold a dry pool's growth while they outnumber the latest
	// ready time's claims; an older one is late (a pod that fails or
	// cannot be placed) and holds nothing.
	Asked []time.Time
}

// PoolPoint is a count decided at a time.
type PoolPoint struct {
	At       time.Time
	Replicas int32
}

// PoolDecision is DecidePool's answer.
type PoolDecision struct {
	Replicas int32
	Reason   PoolReason
	// Demand is the count before the window's earlier counts and the
	// unrecorded floor held it up: the caller keeps it for Recent.
	Demand int32
	// Claims in the window and the rate read from them (per second).
	Claims int
	Rate   float64
}

// String says why, for an Event.
func (d PoolDecision) String() string {
	return fmt.Sprintf("%s: %d claims in the window (%.2f/s)", d.Reason, d.Claims, d.Rate)
}

// DecidePool returns a pool's replica count: the pods claimed while one
// replacement becomes ready (the claim rate over the window times the
// ready time), plus headroom, within [Min, Max]. The rate is the window's
// claims over the span from the oldest of them to Now, at least half the
// ready time (so n claims within half a ready time ask for at most 2n), and
// a burst reads at its own rate at once. A pool with no ready pod while
// claims come grows by the window's claims (at most doubling), once per
// ready time, unless the pods on their way (asked within two ready times)
// outnumber the latest ready time's claims: they will serve them. A lower
// count waits until no decision within the window asked for more. While
// the pool has unrecorded claims it never goes below Ready+Unrecorded (nor
// above Replicas for that reason):
// a ReplicaSet scaling down picks among matching ready pods it cannot tell
// apart, and might take a live instance whose record is still on its way.
func DecidePool(in PoolInput) PoolDecision {
	window := in.Window
	if window <= 0 {
		window = DefaultPoolWindow
	}
	ready := in.ReadyTime
	if ready <= 0 {
		ready = DefaultPoolReadyTime
	}
	from := in.Now.Add(-window)
	var n, latest int // the window's claims; those of the latest ready time
	oldest, newest := in.Now, time.Time{}
	for _, t := range in.Claims {
		if t.Before(from) || t.After(in.Now) {
			continue
		}
		n++
		if !t.Before(in.Now.Add(-ready)) {
			latest++
		}
		if t.Before(oldest) {
			oldest = t
		}
		if t.After(newest) {
			newest = t
		}
	}
	d := PoolDecision{Claims: n, Reason: PoolReasonDemand}
	if n > 0 {
		d.Rate = float64(n) / max(in.Now.Sub(oldest), ready/2).Seconds()
	}
	need := math.Ceil(d.Rate*ready.Seconds() - 1e-9)
	want := int64(need) + int64(max(in.Headroom, 0))
	// A dry pool, no pod ready while claims come: claims then come as fast
	// as pods do, so their rate understates the demand. Grow by the
	// window's claims, at most doubling, once per ready time (the new
	// pods' start), as a slow start does; not while the pods already on
	// their way outnumber the claims of the latest ready time: the pool is
	// then as dry as a start takes, not short of pods (without this rule,
	// a burst ran the pool to its maximum, starting twice the pods it
	// needed on a CPU-bound node).
	coming := 0
	for _, t := range in.Asked {
		if !t.Before(in.Now.Add(-2*ready)) && !t.After(in.Now) {
			coming++
		}
	}
	if in.Ready == 0 && n > 0 && in.Now.Sub(newest) <= ready && in.Now.Sub(in.LastUp) >= ready && coming <= latest {
		if dry := int64(in.Replicas) + min(int64(in.Replicas), int64(n)); dry > want {
			want, d.Reason = dry, PoolReasonDry
		}
	}
	lo, hi := int64(max(in.Min, 0)), int64(max(in.Max, in.Min, 0))
	switch {
	case want < lo:
		want, d.Reason = lo, PoolReasonMin
	case want > hi:
		want, d.Reason = hi, PoolReasonMax
	}
	d.Demand = int32(min(want, math.MaxInt32))
	for _, r := range in.Recent {
		if !r.At.Before(from) && !r.At.After(in.Now) && int64(r.Replicas) > want && want < int64(in.Replicas) {
			want, d.Reason = min(int64(r.Replicas), int64(in.Replicas), hi), PoolReasonStabilized
		}
	}
	if in.Unrecorded > 0 {
		floor := min(int64(in.Ready)+int64(in.Unrecorded), int64(in.Replicas))
		if want < floor {
			want, d.Reason = floor, PoolReasonUnrecorded
		}
	}
	d.Replicas = int32(min(want, math.MaxInt32))
	return d
}
