package controller

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors the controller's operations wrap; grpcStatus maps them to
// gRPC codes, and it is the only place that maps an error to a code (the
// refusals of authz.go, callers.go, forward.go and server.go state their
// code directly).
var (
	ErrInvalidName      = errors.New("invalid function name")
	ErrFunctionNotFound = errors.New("function not found")
	ErrNotWatched       = errors.New("namespace not watched by this controller")
	ErrFunctionDeleting = errors.New("function is being deleted")
	// ErrInvalidSpec: the stored Function is one the controller cannot act
	// on (it does not convert, or fails validation); its owner reports why
	// in its Degraded condition.
	ErrInvalidSpec      = errors.New("function spec is invalid")
	ErrPoolNotFound     = errors.New("pool not found")
	ErrNoPort           = errors.New("no instance port")
	ErrPoolEmpty        = errors.New("pool has no ready pods")
	ErrAssign           = errors.New("assign instance")
	ErrNotSynced        = errors.New("controller caches not synced yet")
	ErrForward          = errors.New("forward to owner")
	ErrShuttingDown     = errors.New("controller shutting down")
	ErrInstanceNotFound = errors.New("instance not found")
	ErrNotHolder        = errors.New("instance handed to another router")
	ErrNotOneshot       = errors.New("function is not oneshot")
	ErrNoRouter         = errors.New("router identity missing")
	// ErrClaimRateLimited: the caller started more claims than
	// --claim-rate-per-router / --claim-burst-per-router allow.
	ErrClaimRateLimited = errors.New("claim rate limit exceeded")
	// ErrInvalidRequest: a field of the request is outside its bound (see
	// wire.go).
	ErrInvalidRequest = errors.New("invalid request")
	// ErrTooManyStreams: the replica holds its most router streams.
	ErrTooManyStreams = errors.New("too many router streams")
)

// grpcStatus maps err to the status returned to callers. A status already
// carried by err (an owner's answer to a forwarded call) passes through.
func grpcStatus(err error) *status.Status {
	if err == nil {
		return nil
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus()
	}
	code := codes.Internal
	switch {
	case errors.Is(err, ErrInvalidName), errors.Is(err, ErrNoRouter), errors.Is(err, ErrInvalidRequest):
		code = codes.InvalidArgument
	case errors.Is(err, ErrFunctionNotFound), errors.Is(err, ErrNotWatched), errors.Is(err, ErrInstanceNotFound):
		code = codes.NotFound
	case errors.Is(err, ErrFunctionDeleting), errors.Is(err, ErrPoolNotFound), errors.Is(err, ErrNoPort), errors.Is(err, ErrNotOneshot),
		errors.Is(err, ErrInvalidSpec):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrPoolEmpty), errors.Is(err, ErrClaimRateLimited), errors.Is(err, ErrTooManyStreams):
		code = codes.ResourceExhausted
	case errors.Is(err, ErrAssign), errors.Is(err, ErrNotSynced), errors.Is(err, ErrForward), errors.Is(err, ErrShuttingDown):
		code = codes.Unavailable
	case errors.Is(err, ErrNotHolder):
		code = codes.PermissionDenied
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return status.New(code, err.Error())
}

// grpcError is grpcStatus as an error.
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	return grpcStatus(err).Err()
}

// reasonError is a sentinel with a message fit for the caller: Error gives
// the message alone, errors.Is finds the sentinel.
type reasonError struct {
	sentinel error
	msg      string
}

func (e *reasonError) Error() string { return e.msg }
func (e *reasonError) Unwrap() error { return e.sentinel }

func withReason(sentinel error, format string, a ...any) error {
	return &reasonError{sentinel: sentinel, msg: fmt.Sprintf(format, a...)}
}
