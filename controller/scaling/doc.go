// Package scaling decides how many instances a function should hold, and
// merges the routers' heartbeat reports that feed that decision.
//
// # The decision
//
// [Decide] is a pure function of (Input, Policy): no I/O, no clock (the
// caller passes Input.Now), no goroutines, no hidden state and no
// allocations. It implements the Kubernetes HorizontalPodAutoscaler's
// replica calculation per metric and combines the metrics the way HPA does:
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
// Invariants: the result is within [MinInstances, MaxInstances] except for
// an idle scale to zero; it is never below the current count while the owner
// warms up; it never scales down to less than any recommendation recorded in
// the window (the history is bounded and, when it must drop detail, keeps
// the higher value for longer, so it may hold a scale-down longer than HPA
// would but never releases it earlier).
//
// # How callers drive it
//
// A supervisor, once per tick, builds an Input from its informer view (every
// non-terminating instance it holds, plus claims it expects as not-ready
// instances) and from the report [Window], passes the History the previous
// call returned (the zero History for a function it just took over), calls
// Decide and stores Decision.History for the next call. It converges to
// Decision.Instances and reports Decision.Reason. The package never reads the
// Kubernetes objects itself: the caller maps the Function spec to a Policy.
//
// # The report window
//
// [Window] merges the routers' heartbeat reports for one function: gauges
// (in-flight, queued, per-instance load) latest-wins per router; cumulative
// counters per router incarnation turned into deltas, so lost, repeated or
// reordered reports never count twice; a router silent for the heartbeat
// timeout counts as zero. It is pure too (time is an argument) and not safe
// for concurrent use: one supervisor owns each Window.
//
// [DecidePool] is the pool autoscaler's decision (issue 15): a pool
// Deployment's replicas from the claim rate over a window times the
// measured pod start, plus headroom, within the pool's bounds, with dry
// pools grown, scale-downs stabilized over the window and held while
// claims are unrecorded. Pure as Decide is.
package scaling
