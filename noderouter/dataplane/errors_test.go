package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestControllerAnswer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantReason string
		wantResult string
		retry      bool
	}{
		{"not found", status.Error(codes.NotFound, "x"), 404, ReasonUnknownFunction, ResultNotFound, false},
		{"invalid", status.Error(codes.InvalidArgument, "x"), 400, ReasonMalformedFunction, ResultInvalidArgument, false},
		{"exhausted", status.Error(codes.ResourceExhausted, "x"), 503, ReasonNoCapacity, ResultResourceExhausted, true},
		{"deadline", status.Error(codes.DeadlineExceeded, "x"), 503, ReasonColdStartTimeout, ResultDeadlineExceeded, true},
		{"unavailable", status.Error(codes.Unavailable, "x"), 503, ReasonNoController, ResultUnavailable, true},
		{"conn closed under the call", status.Error(codes.Canceled, "x"), 503, ReasonNoController, ResultUnavailable, true},
		{"caller gone", fmt.Errorf("wait: %w", context.Canceled), StatusClientClosed, ReasonClientClosed, ResultError, false},
		{"internal", status.Error(codes.Internal, "x"), 503, ReasonControllerError, ResultError, true},
		{"unimplemented", status.Error(codes.Unimplemented, "x"), 503, ReasonControllerError, ResultError, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, res := controllerAnswer(tt.err)
			if a.status != tt.wantStatus || a.reason != tt.wantReason || res != tt.wantResult || a.retryAfter != tt.retry {
				t.Errorf("got %d %s %s retry=%v; want %d %s %s retry=%v", a.status, a.reason, res, a.retryAfter,
					tt.wantStatus, tt.wantReason, tt.wantResult, tt.retry)
			}
		})
	}
}

func TestUpstreamAnswer(t *testing.T) {
	t.Parallel()
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantReason string
	}{
		{"dial", fmt.Errorf("proxy: %w", dial), http.StatusServiceUnavailable, ReasonNoInstances},
		{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, http.StatusServiceUnavailable, ReasonNoInstances},
		{"timeout", context.DeadlineExceeded, http.StatusGatewayTimeout, ReasonUpstreamTimeout},
		{"caller gone", context.Canceled, StatusClientClosed, ReasonClientClosed},
		{"reset", &net.OpError{Op: "read", Err: errors.New("connection reset")}, http.StatusBadGateway, ReasonUpstreamError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := upstreamAnswer(tt.err)
			if a.status != tt.wantStatus || a.reason != tt.wantReason {
				t.Errorf("got %d %s, want %d %s", a.status, a.reason, tt.wantStatus, tt.wantReason)
			}
		})
	}
}
