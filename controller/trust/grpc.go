package trust

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// Metadata keys (skipperv1 holds the contract's constants, which the
// router shares).
const (
	HeaderAuthorization = skipperv1.HeaderAuthorization
	HeaderCaller        = skipperv1.HeaderCaller
)

type ctxKey struct{}

// WithIdentity returns ctx carrying the caller's identity (the
// interceptors do this; tests may too).
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the identity the interceptors put in ctx.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}

// BearerToken returns the token of metadata key in the incoming ctx ("" and
// no error when there is none).
func BearerToken(ctx context.Context, key string) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get(key)
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", errors.New(key + ": more than one value")
	}
	scheme, tok, ok := strings.Cut(vs[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(tok) == "" {
		return "", errors.New(key + ": want \"Bearer <token>\"")
	}
	return strings.TrimSpace(tok), nil
}

// Status turns an Authenticate error into the gRPC status a caller gets.
func Status(err error) error {
	switch {
	case errors.Is(err, ErrUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	default:
		return status.Error(codes.Unauthenticated, err.Error())
	}
}

// authenticate reviews the caller's own token of ctx.
func (a *Authenticator) authenticate(ctx context.Context) (context.Context, error) {
	tok, err := BearerToken(ctx, HeaderAuthorization)
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	id, err := a.Authenticate(ctx, tok)
	if err != nil {
		return nil, Status(err)
	}
	return WithIdentity(ctx, id), nil
}

// UnaryInterceptor authenticates every unary call but those skip names
// (full method names, e.g. the health service's), putting the identity in
// the handler's context.
func (a *Authenticator) UnaryInterceptor(skip func(fullMethod string) bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if skip != nil && skip(info.FullMethod) {
			return h(ctx, req)
		}
		ctx, err := a.authenticate(ctx)
		if err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

// StreamInterceptor is UnaryInterceptor for streams.
func (a *Authenticator) StreamInterceptor(skip func(fullMethod string) bool) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if skip != nil && skip(info.FullMethod) {
			return h(srv, ss)
		}
		ctx, err := a.authenticate(ss.Context())
		if err != nil {
			return err
		}
		return h(srv, &identityStream{ServerStream: ss, ctx: ctx})
	}
}

type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }
