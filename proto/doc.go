// Package proto holds the gRPC contract between Skipper's routers and
// controllers (skipper/v1/controller.proto) and the generation directive; the
// generated Go code lives in package skipperv1 and is committed. buf (pinned
// in the nested module proto/tools, with the well-known types built in)
// generates it with the protoc-gen-go and protoc-gen-go-grpc plugins of the
// main module's tool block, so no host protoc is involved. Run
// `make generate` after editing the .proto and `make verify` to check that the
// committed code matches.
package proto
