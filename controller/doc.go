// Package controller is a Skipper controller replica: it watches Functions,
// pool Deployments and their pods, owns the Functions the ring assigns it,
// claims warm pool pods for them and serves gRPC skipper.v1.Controller to
// the node routers.
//
// Shape: Run parses a Config and builds Kubernetes clients; serve wires the
// parts and owns every goroutine. The decisions are pure functions in
// decide.go (ring members from EndpointSlices, instance sets from pods,
// claim candidates, the claim patch, generations); controller.go feeds them
// informer state from work queues; claim.go carries out claims; server.go
// and hub.go are the gRPC surface and the routers' streams.
//
// Invariants:
//   - Every write is a patch or a create; a claim is one JSON patch whose
//     test ops (labels and resourceVersion as cached) make it apply only to
//     the pod as this replica saw it, so concurrent claimers never share a pod.
//   - Claims for one function are serialised on one flight; a claim is
//     remembered (assumed) until the informer shows it or assumedTTL passes,
//     so a lagging cache never makes a second claim for the same need.
//   - A request for a function owned elsewhere on this replica's ring is
//     forwarded once; a forwarded request is answered locally. An empty ring
//     (no ready replica yet) is answered locally.
//   - Readiness (/readyz, gRPC health) is the caches having synced, never ring
//     membership.
//   - Generations per function strictly increase and are seeded from the
//     clock, so routers' "apply only newer" holds across restarts and owners.
//   - gRPC codes come from grpcStatus alone.
package controller
