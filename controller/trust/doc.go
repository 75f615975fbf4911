// Package trust authenticates the callers of the controllers' gRPC port
// (issue 16): routers, sidecar routers and other controller replicas send a
// projected ServiceAccount token (audience "skipper") as gRPC metadata
// `authorization: Bearer <token>`; a controller reviews it with the API
// server's TokenReview and takes the caller's identity from the review
// (ServiceAccount, and for a token bound to a pod, the pod and its node).
//
// Reviews are cached by the token's SHA-256 until the token expires
// (bounded), and a cached review is honoured while the API server is
// unreachable, so routers keep working through an outage. What an identity
// may do is the controller's policy; this package only says who it is.
package trust
