// Package skipperv1 is the gRPC contract skipper.v1.Controller between the
// node routers and the controller replicas, generated from
// proto/skipper/v1/controller.proto (committed; `make verify` checks it),
// plus the per-call credentials both sides share. The .proto's header
// states its rules: it only grows, and no message field carries a token.
//
// A router holds one Connect stream per replica it needs (Hello, Welcome;
// then Reports up, AssignmentUpdates down, each applied generation
// acknowledged with an Ack), calls GetInstance on a cache miss and
// ReleaseInstance after a oneshot instance's one request. Every call
// carries the caller's projected ServiceAccount token (audience Audience)
// as HeaderAuthorization, and a forwarded call the original caller's as
// HeaderCaller; TokenFile reads the kubelet-rotated token file as
// credentials.PerRPCCredentials.
package skipperv1
