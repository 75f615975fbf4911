package controller

import (
	"context"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// forwarder sends GetInstance to the owning replica, one client connection
// per owner address, kept until shutdown.
type forwarder struct {
	creds *skipperv1.TokenFile // this replica's own token; nil: none
	// transport, when set before the first forward, secures connections
	// to the owners (TLS, --tls-dir); nil: plaintext.
	transport credentials.TransportCredentials
	mu        sync.Mutex
	conns     map[string]*grpc.ClientConn
}

// newForwarder sends the token in tokenFile ("": none) on every forward.
func newForwarder(tokenFile string) *forwarder {
	f := &forwarder{conns: map[string]*grpc.ClientConn{}}
	if tokenFile != "" {
		f.creds = skipperv1.NewTokenFile(tokenFile)
	}
	return f
}

func (f *forwarder) conn(addr string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cc, ok := f.conns[addr]; ok {
		return cc, nil
	}
	transport := f.transport
	if transport == nil {
		transport = insecure.NewCredentials()
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(transport)}
	if f.creds != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(f.creds))
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return nil, err
	}
	f.conns[addr] = cc
	return cc, nil
}

// getInstance forwards req once to owner: the copy is marked forwarded, so
// the owner answers it itself whatever its own view of the ring.
func (f *forwarder) getInstance(ctx context.Context, owner string, req *skipperv1.GetInstanceRequest, timeout time.Duration) (*skipperv1.GetInstanceResponse, error) {
	fwd := proto.CloneOf(req)
	fwd.Forwarded = true
	return forward(ctx, f, owner, timeout, func(ctx context.Context, cl skipperv1.ControllerClient) (*skipperv1.GetInstanceResponse, error) {
		return cl.GetInstance(ctx, fwd)
	})
}

// releaseInstance forwards req once to owner, like getInstance.
func (f *forwarder) releaseInstance(ctx context.Context, owner string, req *skipperv1.ReleaseInstanceRequest, timeout time.Duration) (*skipperv1.ReleaseInstanceResponse, error) {
	fwd := proto.CloneOf(req)
	fwd.Forwarded = true
	return forward(ctx, f, owner, timeout, func(ctx context.Context, cl skipperv1.ControllerClient) (*skipperv1.ReleaseInstanceResponse, error) {
		return cl.ReleaseInstance(ctx, fwd)
	})
}

// forward calls owner with call, bounded by timeout when ctx sets no deadline.
func forward[T any](ctx context.Context, f *forwarder, owner string, timeout time.Duration, call func(context.Context, skipperv1.ControllerClient) (T, error)) (T, error) {
	cc, err := f.conn(owner)
	if err != nil {
		var zero T
		return zero, withReason(ErrForward, "forward to owner %s: %v", owner, err)
	}
	// The owner decides on the original caller: pass its token on.
	if ctx, err = callerToken(ctx); err != nil {
		var zero T
		return zero, status.Errorf(codes.Unauthenticated, "forward to owner %s: %v", owner, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return call(ctx, skipperv1.NewControllerClient(cc))
}

// retain closes the connections to addresses no longer on the ring.
func (f *forwarder) retain(members []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for addr, cc := range f.conns {
		if !slices.Contains(members, addr) {
			_ = cc.Close()
			delete(f.conns, addr)
		}
	}
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for addr, cc := range f.conns {
		_ = cc.Close()
		delete(f.conns, addr)
	}
}
