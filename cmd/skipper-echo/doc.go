// Command skipper-echo is Skipper's reference instance runtime: the image a
// pool runs to show, and to test, the instance contract.
//
// It serves HTTP on --listen and answers:
//
//   - POST /__skipper/assign: the controller hands the pod to a function
//     (the instance contract, served by package controller/instance). The
//     body is an assign.Request whose token must verify against one of the
//     public keys at --assign-key for audience = this pod's UID (--pod-uid)
//     and was signed for this very body (assign.VerifyRequest). 200 with a
//     small JSON body once ready; 400 malformed body; 401 with reason
//     bad_token (foreign, forged, or signed for another body), expired, or
//     replayed (a token is accepted once; a fresh token for the function
//     held is accepted); 409 already assigned to another function; 503
//     while the key file is not there yet (the volume may appear after the
//     container starts, so the key is read on every assign until it loads;
//     after that at most once a second, so a rotated key is seen without a
//     restart).
//   - GET /__skipper/assign: what the pod holds, read-only (also
//     controller/instance): 200 with the function; 404 unassigned, or
//     other_pod when ?pod= names another pod's UID.
//   - GET /healthz: the readiness probe, always 200.
//   - anything else: an echo. 200 with a JSON body naming the method, path,
//     query, headers, body, the pod and its assignment ("assigned": false
//     before an assign). Behaviour on demand, by query parameter or header:
//     sleep=<duration> / X-Echo-Sleep (bounded by --max-sleep, ends early when
//     the caller goes away), status=<code> / X-Echo-Status (answer with that
//     status), fail=1 / X-Echo-Fail (drop the connection without an answer,
//     for retry tests), cut=1 / X-Echo-Cut (send the headers and half the
//     body, chunked, then drop the connection), stall=<duration> /
//     X-Echo-Stall (send the headers and half the body, chunked, wait, then
//     the rest; bounded by
//     --max-sleep, ends early when the caller goes away). Query parameters
//     win over headers.
//
// The assignment lives in memory only: a restarted container is unassigned,
// which the controller detects and retires the pod. SIGTERM shuts the server
// down gracefully within --shutdown-timeout.
package main
