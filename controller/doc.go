// Package controller is a Skipper controller replica: it watches Functions,
// pool Deployments and their pods, owns the Functions the ring assigns it,
// claims warm pool pods for them and serves gRPC skipper.v1.Controller to
// the node routers.
//
// Shape: Run parses a Config and builds Kubernetes clients; serve wires the
// parts and owns every goroutine. The decisions are pure functions in
// decide.go and decide_claim.go (instance sets from pods, claim candidates,
// the claim's record patch, scale-down victims, generations); ownership.go
// is the ring's view, claims.go the claim bookkeeping (flights,
// reservations, pods assumed, held, being recorded or retired) under its
// own lock, plan.go a supervisor tick's decision (decidePlan, pure over a
// snapshot, scaling.Decide inside), drain.go the withdrawal of instances,
// forward.go the connections to other replicas;
// controller.go feeds them informer state from work queues; claim.go carries
// out claims (the assign), record.go writes their records after, limiter.go
// bounds each router's claims; supervisor.go runs one goroutine per owned
// Function that feeds the routers' reports into a scaling.Window, calls
// decidePlan every --scale-interval and, through supervisorHost, claims,
// drains and retires instances; status.go writes Function status; server.go and hub.go are the
// gRPC surface and the routers' streams.
//
// Invariants:
//   - Lock order: controller.mu, then claims.mu, then poolStats.mu; a
//     supervisor's mu is taken alone (see controller.claims).
//   - The instance decides a claim: it accepts one function for its life,
//     so concurrent claimers never share a pod (the loser gets 409 naming
//     the holder). The record follows in the background, one JSON patch
//     whose test ops (UID, labels and ownerReferences as last read) never
//     overwrite another function's, retried until it lands; until then the
//     pod is assumed. Every write is a patch or a create.
//   - Expectations: a function's expected instances are the claimed pods the
//     cache shows, claims it does not show yet (assumed until the informer
//     shows them, or assumedTTL passes once their record landed) and claims in flight (a pod being
//     claimed counts once, as its flight). A scale-up counts them and starts
//     its flights in one critical section, and a cold GetInstance joins a
//     flight in progress rather than claiming, so neither concurrent callers
//     nor a lagging cache ever claim for the same need twice. At most
//     --max-parallel-claims claims patch and assign at once.
//   - Drain: a scale-down first withdraws an instance (retired: left out of
//     every set) and pushes the new generation; the pod is deleted when every
//     subscribed router acknowledged it and reports no request in flight on
//     it a report interval after the ack, or at --drain-timeout.
//   - A supervisor runs only on the owner: it checks ownership every tick and
//     stops when the function moves, goes, or is idle with no instances; a
//     new supervisor never scales down before one --heartbeat-timeout window.
//   - A claimed pod whose container restarted since the claim (restart count
//     at the assign, recorded on the pod) is retired and deleted; a
//     oneshot instance is handed to one router only (recorded on the pod),
//     never in the shared set, and deleted on ReleaseInstance or at
//     --oneshot-lease.
//   - A request for a function owned elsewhere on this replica's ring is
//     forwarded once; a forwarded request is answered locally. An empty ring
//     (no ready replica yet) is answered locally.
//   - Readiness (/readyz, gRPC health) is the caches having synced, never ring
//     membership.
//   - Generations per function strictly increase and are seeded from the
//     clock, so routers' "apply only newer" holds across restarts and owners.
//   - An operation's error becomes a gRPC code in grpcStatus (errors.go)
//     alone; refusals of who is calling (authz.go, callers.go, forward.go,
//     trust) and of the Connect stream itself (server.go) build their
//     status where they refuse.
//   - No stored object stops a controller: the Function transform never
//     fails; an object that does not convert or fails validate is cached as
//     an invalidFunction, skipped by every decision, and reported by its
//     owner as Degraded (reason InvalidSpec).
//   - A pod reaches an instance set only once its instance accepted the
//     assign (a pod an older controller marked skipper.dev/assign-pending
//     never); scale-ups start at most the pool's candidates and
//     --max-parallel-claims claims.
//   - Values from routers pass wire.go's checks before anything applies
//     them; a violation is counted and never applied.
package controller
