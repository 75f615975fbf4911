package noderouter

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
		{"not found", status.Error(codes.NotFound, "x"), 404, reasonUnknownFunction, resultNotFound, false},
		{"invalid", status.Error(codes.InvalidArgument, "x"), 400, reasonMalformedFunction, resultInvalidArgument, false},
		{"exhausted", status.Error(codes.ResourceExhausted, "x"), 503, reasonNoCapacity, resultResourceExhausted, true},
		{"deadline", status.Error(codes.DeadlineExceeded, "x"), 503, reasonColdStartTimeout, resultDeadlineExceeded, true},
		{"unavailable", status.Error(codes.Unavailable, "x"), 503, reasonNoController, resultUnavailable, true},
		{"conn closed under the call", status.Error(codes.Canceled, "x"), 503, reasonNoController, resultUnavailable, true},
		{"caller gone", fmt.Errorf("wait: %w", context.Canceled), StatusClientClosed, reasonClientClosed, resultError, false},
		{"internal", status.Error(codes.Internal, "x"), 503, reasonControllerError, resultError, true},
		{"unimplemented", status.Error(codes.Unimplemented, "x"), 503, reasonControllerError, resultError, true},
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
		{"dial", fmt.Errorf("proxy: %w", dial), http.StatusServiceUnavailable, reasonNoInstances},
		{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, http.StatusServiceUnavailable, reasonNoInstances},
		{"timeout", context.DeadlineExceeded, http.StatusGatewayTimeout, reasonUpstreamTimeout},
		{"caller gone", context.Canceled, StatusClientClosed, reasonClientClosed},
		{"reset", &net.OpError{Op: "read", Err: errors.New("connection reset")}, http.StatusBadGateway, reasonUpstreamError},
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
