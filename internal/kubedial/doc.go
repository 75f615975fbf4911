// Package kubedial is the dial function Skipper's Kubernetes clients use:
// a connect the API server refuses is tried again, every second or so,
// until it is accepted, the request's context ends or the Dialer's own
// lifetime does.
//
// Why: a refused connection is what every client sees while a single API
// server restarts behind the kubernetes Service (its lease reconciler
// withdraws the endpoint as it stops, and kube-proxy rejects the Service
// address until the endpoint is back). client-go's reflectors answer each
// refusal with an exponential backoff that reaches 30–60 s after about
// twenty seconds of outage, so a controller's or a router's cache stayed
// up to a minute behind after the API server was back: new Functions
// unknown, gone pods still claimed. Waiting in the dial instead, the
// reflector never sees the refusal and its watch resumes within a second
// of the API server accepting again. A dial that fails otherwise (timeout,
// no route) returns at once, and client-go's own backoff applies.
//
// Since Go 1.23 net/http dials with the request's values but not its
// cancellation (a dial outlives a request that gave up on it), so the
// Dialer takes a lifetime of its own: Run's context, which ends at
// shutdown and stops every dial still waiting.
package kubedial
