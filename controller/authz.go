package controller

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"skipper.dev/skipper/controller/trust"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// Auth modes (--auth).
const (
	authTokenReview = "tokenreview"
	authNone        = "none"
)

// healthMethod prefixes the gRPC health service's methods: probes call it
// without a token.
const healthMethod = "/grpc.health.v1.Health/"

// authz decides what an authenticated caller may do (issue 16): act as the
// router its token names (the DaemonSet's ServiceAccount, or one granted
// the sidecar access), forward as a replica, read GetState. nil: --auth
// none, everyone may do everything.
type authz struct {
	auth     *trust.Authenticator
	keys     *trust.KeySet // the API server's signing keys, for tokens it cannot review while away
	sidecars interface {
		Allowed(context.Context, trust.Identity) (bool, error)
	}
	routerSA   saRef // the DaemonSet routers' ServiceAccount
	controller saRef // the replicas' own
	debugGroup string
}

// newAuthz is the policy cfg asks for; nil for --auth none.
func newAuthz(cfg Config, cs kubernetes.Interface) *authz {
	if cfg.Auth != authTokenReview {
		return nil
	}
	routerSA, _ := cfg.serviceAccount(cfg.RouterServiceAccount, "skipper-noderouter") // Validate checked both
	ctlSA, _ := cfg.serviceAccount(cfg.ControllerServiceAccount, "skipper-controller")
	auth := trust.NewAuthenticator(trust.TokenReviewer{CS: cs}, 0)
	keys := &trust.KeySet{}
	auth.VerifyLocally(keys)
	return &authz{
		auth:       auth,
		keys:       keys,
		sidecars:   &trust.SidecarAccess{CS: cs},
		routerSA:   routerSA,
		controller: ctlSA,
		debugGroup: cfg.DebugGroup,
	}
}

// keysRefresh is how often the API server's signing keys are read again.
const keysRefresh = 10 * time.Minute

// runKeys keeps a.keys current until ctx ends: the API server's
// service-account issuer and keys, which verify tokens never reviewed
// while it is unreachable (docs/security.md).
func (a *authz) runKeys(ctx context.Context, rc rest.Interface, log *slog.Logger) {
	if rc == nil {
		return // a fake client in tests
	}
	a.keys.Run(ctx, rc, keysRefresh, func(err error) {
		log.Warn("service-account signing keys not read: tokens never reviewed cannot be verified while the API server is away", "err", err)
	})
}

// saRef is a ServiceAccount as namespace and name.
type saRef struct{ ns, name string }

func (r saRef) String() string { return r.ns + "/" + r.name }

// parseSARef reads "namespace/name".
func parseSARef(s string) (saRef, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return saRef{}, fmt.Errorf("%q: want namespace/name", s)
	}
	return saRef{ns, name}, nil
}

func (r saRef) is(id trust.Identity) bool { return id.IsServiceAccount(r.ns, r.name) }

// denied is a PermissionDenied status.
func denied(format string, a ...any) error {
	return status.Errorf(codes.PermissionDenied, format, a...)
}

// identity is the caller the interceptor authenticated.
func identity(ctx context.Context) (trust.Identity, error) {
	id, ok := trust.FromContext(ctx)
	if !ok {
		return trust.Identity{}, status.Error(codes.Unauthenticated, "no authenticated caller")
	}
	return id, nil
}

// routerMatches checks that rid, the router identity a request names, is
// the pod and node id's token is bound to: a router speaks only for itself.
func routerMatches(id trust.Identity, rid *skipperv1.RouterIdentity) error {
	if id.Pod == "" || id.Node == "" {
		return denied("%s: the token is not bound to a pod on a node (a projected ServiceAccount token is)", id)
	}
	if want := id.Namespace + "/" + id.Pod; rid.GetPod() != want {
		return denied("%s: names router pod %q, but the token is pod %s's", id, rid.GetPod(), want)
	}
	if rid.GetNode() != id.Node {
		return denied("%s: names node %q, but the token's pod runs on node %s", id, rid.GetNode(), id.Node)
	}
	return nil
}

// asRouter checks that the caller of ctx may act as router rid. A forwarded
// request's caller is the original router, whose token the forwarding
// replica passed on (trust.HeaderCaller); the forwarder must be a replica.
func (a *authz) asRouter(ctx context.Context, rid *skipperv1.RouterIdentity, forwarded bool) error {
	_, err := a.router(ctx, rid, forwarded)
	return err
}

// router is asRouter, and returns the caller of a sidecar router's
// requests: its own pod, as its token says (nil for a DaemonSet router,
// whose requests name the pod they came from, and with --auth none).
func (a *authz) router(ctx context.Context, rid *skipperv1.RouterIdentity, forwarded bool) (*skipperv1.Caller, error) {
	if a == nil {
		return nil, nil
	}
	id, err := identity(ctx)
	if err != nil {
		return nil, err
	}
	if forwarded {
		if !a.controller.is(id) {
			return nil, denied("%s: only controller replicas (%s) forward requests", id, a.controller)
		}
		tok, err := trust.BearerToken(ctx, trust.HeaderCaller)
		if err != nil || tok == "" {
			return nil, status.Errorf(codes.Unauthenticated, "forwarded request without the caller's token (%s)", trust.HeaderCaller)
		}
		if id, err = a.auth.Authenticate(ctx, tok); err != nil {
			return nil, trust.Status(fmt.Errorf("forwarded caller: %w", err))
		}
	}
	if err := routerMatches(id, rid); err != nil {
		return nil, err
	}
	if a.routerSA.is(id) {
		return nil, nil
	}
	ok, err := a.sidecars.Allowed(ctx, id)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "%s: sidecar router access: %v", id, err)
	}
	if !ok {
		return nil, denied("%s: not a router: only ServiceAccount %s and those granted %q on %s.%s (the skipper-sidecar-router ClusterRole) may call",
			id, a.routerSA, trust.SidecarVerb, trust.SidecarResource, trust.SidecarGroup)
	}
	return &skipperv1.Caller{Namespace: id.Namespace, ServiceAccount: id.ServiceAccount, Pod: id.Namespace + "/" + id.Pod}, nil
}

// state checks that the caller of ctx may read GetState: a replica, or a
// member of the debug group.
func (a *authz) state(ctx context.Context) error {
	if a == nil {
		return nil
	}
	id, err := identity(ctx)
	if err != nil {
		return err
	}
	if a.controller.is(id) || (a.debugGroup != "" && id.InGroup(a.debugGroup)) {
		return nil
	}
	if a.debugGroup == "" {
		return denied("%s: GetState is for controller replicas (%s) only (--debug-group adds a group)", id, a.controller)
	}
	return denied("%s: GetState is for controller replicas (%s) and group %q", id, a.controller, a.debugGroup)
}

// tokenExpiry is a channel that receives when the token ctx's caller
// authenticated with expires (nil, never, with auth off or no expiry).
func tokenExpiry(ctx context.Context, auth bool) <-chan time.Time {
	if !auth {
		return nil
	}
	id, ok := trust.FromContext(ctx)
	if !ok || id.Expires.IsZero() {
		return nil
	}
	return time.After(time.Until(id.Expires))
}

// callerToken returns the metadata a replica forwarding ctx's request
// adds: the original caller's token, for the owner to review.
func callerToken(ctx context.Context) (context.Context, error) {
	tok, err := trust.BearerToken(ctx, trust.HeaderAuthorization)
	if err != nil {
		return ctx, err
	}
	if tok == "" {
		return ctx, nil // --auth none: nothing to pass on
	}
	return metadata.AppendToOutgoingContext(ctx, trust.HeaderCaller, "Bearer "+tok), nil
}

// countRefusals counts the calls refused for who the caller is
// (skipper_controller_auth_refusals_total), outermost of the interceptors.
func countRefusals(m *metrics) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	count := func(err error) {
		if c := status.Code(err); c == codes.Unauthenticated || c == codes.PermissionDenied {
			m.authRefusals.WithLabelValues(c.String()).Inc()
		}
	}
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(ctx, req)
			count(err)
			return resp, err
		}, func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			err := h(srv, ss)
			count(err)
			return err
		}
}

// authorizedMethods are the methods whose handlers decide who may call
// them (asRouter, state). Any other method of the Controller service is
// refused before its handler: a new RPC must get its rule here first
// (TestEveryMethodHasARule).
var authorizedMethods = map[string]bool{
	skipperv1.Controller_Connect_FullMethodName:         true, // asRouter at the Hello
	skipperv1.Controller_GetInstance_FullMethodName:     true, // asRouter
	skipperv1.Controller_ReleaseInstance_FullMethodName: true, // asRouter
	skipperv1.Controller_GetState_FullMethodName:        true, // state
}

// denyUnruled refuses methods with no rule in authorizedMethods, but for
// those skip exempts (the health service).
func denyUnruled(skip func(string) bool) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	allowed := func(m string) error {
		if authorizedMethods[m] || skip(m) {
			return nil
		}
		return status.Errorf(codes.PermissionDenied, "%s has no authorization rule", m)
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := allowed(info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := allowed(info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}
}
