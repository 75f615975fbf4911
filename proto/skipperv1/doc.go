// Package skipperv1 is the gRPC contract skipper.v1.Controller between the
// node routers and the controller replicas, generated from
// proto/skipper/v1/controller.proto (`make generate`; the generated files
// are committed and `make verify` checks them), plus the per-call
// credentials both sides share.
//
// Every controller replica serves Controller: a router holds one Connect
// stream per replica it needs (its Hello answered with a Welcome; then one
// Report per interval up, and AssignmentUpdates down for the functions it
// subscribed to, each applied generation acknowledged with an Ack), calls
// GetInstance on a cache miss and ReleaseInstance after a oneshot
// instance's one request; GetState is a replica's debugging view. The .proto file's
// header states the rules: it only grows (fields are added with new
// numbers, never renumbered, retyped or repurposed), and no message field
// carries a token.
//
// Authentication (bearer.go): a caller sends its projected ServiceAccount
// token (audience Audience) as HeaderAuthorization on every call; a replica
// forwarding a request to the owner adds the original caller's token as
// HeaderCaller. TokenFile reads the kubelet-rotated token file as
// credentials.PerRPCCredentials.
package skipperv1
