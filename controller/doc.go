// Package controller is a Skipper controller replica: it watches Functions,
// pool Deployments and their pods, owns the Functions the ring assigns it,
// claims warm pool pods for them and serves gRPC skipper.v1.Controller to
// the node routers. docs/architecture.md ("Pool and claim", "The request
// path") tells the claim, its record, expectations and the drain in full.
//
// Shape: Run parses a Config and builds Kubernetes clients; serve wires the
// parts and owns every goroutine. Pure: decide.go and decide_claim.go
// (instance sets, claim candidates, the record patch, scale-down victims),
// plan.go (a supervisor tick's decidePlan, scaling.Decide inside), wire.go
// (checks of values from routers). claims.go is the claim bookkeeping under
// its own lock. controller.go feeds informer state from work queues;
// claim.go assigns, record.go records after, probe.go asks pool pods what
// they hold, limiter.go bounds each router's claims; supervisor.go runs one
// goroutine per owned Function (decidePlan every --scale-interval, then
// claims, drains and retirements); drain.go withdraws instances;
// ownership.go is the ring's view, forward.go the other replicas,
// status.go the Function status, service.go each Function's own Service
// (an ExternalName of the routers', so callers reach it by name),
// server.go and hub.go the gRPC surface.
//
// Invariants:
//   - Lock order: controller.mu, claims.mu, poolStats.mu; a supervisor's
//     mu is taken alone.
//   - The instance decides a claim; the record follows in the background,
//     one JSON patch whose test ops never overwrite another function's,
//     retried until it lands, the pod assumed meanwhile. Every write is a
//     patch or a create.
//   - Expected instances (cached, assumed and in flight, each pod once) are
//     counted and new flights started in one critical section, and a cold
//     GetInstance joins a flight in progress: no need is claimed for twice.
//     At most the pool's candidates, and --max-parallel-claims assigns at
//     once.
//   - A pod reaches an instance set only once its instance accepted.
//   - A scale-down withdraws an instance and deletes it once every
//     subscribed router acknowledged and has nothing in flight on it, or at
//     --drain-timeout. A new owner scales down only after one
//     --heartbeat-timeout window.
//   - A request for a function owned elsewhere is forwarded once; a
//     forwarded one, or any while the ring is empty, is answered here.
//   - Readiness is the caches having synced, never ring membership.
//   - Generations per function strictly increase, seeded from the clock.
//   - An operation's error becomes a gRPC code in grpcStatus alone; the
//     refusals of who calls (authz.go, callers.go, forward.go, trust) and of
//     the Connect stream (server.go) state their status where they refuse.
//   - No stored object stops a controller: one that does not convert or
//     validate is skipped by every decision and reported Degraded.
//   - Values from routers pass wire.go's checks or are counted and dropped.
package controller
