// Package proto holds the gRPC contract between Skipper's routers and
// controllers (skipper/v1/controller.proto) and the generation directive; the
// generated Go code lives in package skipperv1 and is committed. Run
// `make generate` after editing the .proto and `make verify` to check that the
// committed code matches.
package proto
