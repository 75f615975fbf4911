package controller

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestGRPCStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want codes.Code
		msg  string
	}{
		{name: "invalid", err: withReason(ErrInvalidName, "bad name"), want: codes.InvalidArgument, msg: "bad name"},
		{name: "not found", err: withReason(ErrFunctionNotFound, "function a/b not found"), want: codes.NotFound, msg: "function a/b not found"},
		{name: "not watched", err: ErrNotWatched, want: codes.NotFound},
		{name: "pool missing", err: fmt.Errorf("resolve: %w", ErrPoolNotFound), want: codes.FailedPrecondition},
		{name: "no port", err: ErrNoPort, want: codes.FailedPrecondition},
		{name: "deleting", err: ErrFunctionDeleting, want: codes.FailedPrecondition},
		{name: "pool empty", err: withReason(ErrPoolEmpty, "pool a/p has no ready pods"), want: codes.ResourceExhausted, msg: "pool a/p has no ready pods"},
		{name: "claim rate", err: withReason(ErrClaimRateLimited, "router r started too many claims"), want: codes.ResourceExhausted, msg: "router r started too many claims"},
		{name: "invalid request", err: withReason(ErrInvalidRequest, "GetInstance: too many"), want: codes.InvalidArgument, msg: "GetInstance: too many"},
		{name: "assign", err: ErrAssign, want: codes.Unavailable},
		{name: "not synced", err: ErrNotSynced, want: codes.Unavailable},
		{name: "deadline", err: fmt.Errorf("claim: %w", context.DeadlineExceeded), want: codes.DeadlineExceeded},
		{name: "canceled", err: context.Canceled, want: codes.Canceled},
		{name: "instance not found", err: withReason(ErrInstanceNotFound, "no pod"), want: codes.NotFound, msg: "no pod"},
		{name: "another router's instance", err: ErrNotHolder, want: codes.PermissionDenied},
		{name: "invalid spec", err: withReason(ErrInvalidSpec, "function a/b has an invalid spec: spec.idleTimeout: bad"), want: codes.FailedPrecondition, msg: "function a/b has an invalid spec: spec.idleTimeout: bad"},
		{name: "not oneshot", err: ErrNotOneshot, want: codes.FailedPrecondition},
		{name: "no router", err: ErrNoRouter, want: codes.InvalidArgument},
		{name: "owner's status passes through", err: fmt.Errorf("forward: %w", status.Error(codes.ResourceExhausted, "from owner")), want: codes.ResourceExhausted, msg: "from owner"},
		{name: "anything else", err: errors.New("boom"), want: codes.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := grpcStatus(tt.err)
			if st.Code() != tt.want {
				t.Errorf("code = %v, want %v", st.Code(), tt.want)
			}
			if tt.msg != "" && st.Message() != tt.msg {
				t.Errorf("message = %q, want %q", st.Message(), tt.msg)
			}
		})
	}
	if grpcStatus(nil) != nil {
		t.Error("grpcStatus(nil) != nil")
	}
}
