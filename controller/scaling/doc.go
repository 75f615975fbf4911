// Package scaling decides how many instances a function should hold, and
// merges the routers' heartbeat reports that feed that decision. Every
// decision here is pure: no I/O, no clock (time is an argument), no
// goroutines.
//
// [Decide] is the Kubernetes HorizontalPodAutoscaler's replica calculation
// per metric (CPU and memory per-instance averages with HPA's tolerance and
// its assumptions for missing samples; in-flight plus queued without
// tolerance), the largest recommendation winning, scale-ups at once and
// scale-downs stabilized over a window; its doc states each rule.
// Invariants: the result is within [MinInstances, MaxInstances] except for
// an idle scale to zero (MinInstances 0, nothing in flight or queued for
// IdleTimeout); it is never below the current count while a new owner
// warms up (one heartbeat window); it never scales down below any
// recommendation recorded in the window.
//
// How callers drive it: a supervisor, once per tick, builds an Input from
// its informer view (every non-terminating instance it holds, plus the
// claims it expects as not-ready instances) and from its report [Window],
// passes the History the previous call returned (the zero History for a
// function it just took over), calls Decide, keeps Decision.History for
// the next call, converges to Decision.Instances and reports
// Decision.Reason. The caller maps the Function spec to a Policy; the
// package reads no Kubernetes object.
//
// [Window] merges one function's reports: gauges latest-wins per router,
// cumulative counters turned into deltas per router incarnation (lost,
// repeated or reordered reports never count twice), a silent router
// counting as zero. One supervisor owns each Window.
//
// [DecidePool] is the pool autoscaler's decision: a pool Deployment's
// replicas from the claim rate times the measured pod start, plus headroom.
package scaling
