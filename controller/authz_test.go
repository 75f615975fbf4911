package controller

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"

	"skipper.dev/skipper/controller/trust"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// tableReviewer answers TokenReviews from a table of tokens.
type tableReviewer map[string]authenticationv1.UserInfo

func (r tableReviewer) Review(_ context.Context, tok string) (authenticationv1.TokenReviewStatus, error) {
	u, ok := r[tok]
	return authenticationv1.TokenReviewStatus{Authenticated: ok, User: u}, nil
}

// sidecarTable allows the users in it.
type sidecarTable map[string]bool

func (s sidecarTable) Allowed(_ context.Context, id trust.Identity) (bool, error) {
	if id.ServiceAccount == "broken" {
		return false, errors.New("API server down")
	}
	return s[id.User], nil
}

func saUser(ns, name, pod, node string) authenticationv1.UserInfo {
	return authenticationv1.UserInfo{Username: "system:serviceaccount:" + ns + ":" + name, Extra: map[string]authenticationv1.ExtraValue{
		"authentication.kubernetes.io/pod-name": {pod}, "authentication.kubernetes.io/node-name": {node}}}
}

func testAuthz() *authz {
	users := tableReviewer{
		"router-1": saUser("skipper-system", "skipper-noderouter", "r1", "node1"),
		"ctl":      saUser("skipper-system", "skipper-controller", "c0", "node1"),
		"sidecar":  saUser("shop", "caller", "app-1", "node2"),
		"tenant":   saUser("shop", "default", "web-1", "node2"),
		"debugger": {Username: "alice", Groups: []string{"skipper:debug"}},
		"broken":   saUser("shop", "broken", "b-1", "node2"),
	}
	return &authz{auth: trust.NewAuthenticator(users, 0), sidecars: sidecarTable{"system:serviceaccount:shop:caller": true},
		router: saRef{"skipper-system", "skipper-noderouter"}, controller: saRef{"skipper-system", "skipper-controller"}, debugGroup: "skipper:debug"}
}

// as is ctx as the interceptor leaves it for token, with extra metadata.
func as(t *testing.T, a *authz, token string, md ...string) context.Context {
	t.Helper()
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(append([]string{trust.HeaderAuthorization, "Bearer " + token}, md...)...))
	id, err := a.auth.Authenticate(ctx, token)
	if err != nil {
		t.Fatalf("authenticate %s: %v", token, err)
	}
	return trust.WithIdentity(ctx, id)
}

func TestAuthzRouter(t *testing.T) {
	a := testAuthz()
	r1 := &skipperv1.RouterIdentity{Node: "node1", Pod: "skipper-system/r1"}
	for _, tc := range []struct {
		name      string
		ctx       context.Context
		rid       *skipperv1.RouterIdentity
		forwarded bool
		code      codes.Code
	}{
		{"the router as itself", as(t, a, "router-1"), r1, false, codes.OK},
		{"the router as another pod", as(t, a, "router-1"), &skipperv1.RouterIdentity{Node: "node1", Pod: "skipper-system/r2"}, false, codes.PermissionDenied},
		{"the router for another node", as(t, a, "router-1"), &skipperv1.RouterIdentity{Node: "node2", Pod: "skipper-system/r1"}, false, codes.PermissionDenied},
		{"a granted sidecar as itself", as(t, a, "sidecar"), &skipperv1.RouterIdentity{Node: "node2", Pod: "shop/app-1"}, false, codes.OK},
		{"a tenant as itself", as(t, a, "tenant"), &skipperv1.RouterIdentity{Node: "node2", Pod: "shop/web-1"}, false, codes.PermissionDenied},
		{"a sidecar whose access cannot be asked", as(t, a, "broken"), &skipperv1.RouterIdentity{Node: "node2", Pod: "shop/b-1"}, false, codes.Unavailable},
		{"a token not bound to a pod", as(t, a, "debugger"), r1, false, codes.PermissionDenied},
		{"no identity", t.Context(), r1, false, codes.Unauthenticated},
		{"forwarded by a replica for the router", as(t, a, "ctl", trust.HeaderCaller, "Bearer router-1"), r1, true, codes.OK},
		{"forwarded by a replica, the router's token naming another", as(t, a, "ctl", trust.HeaderCaller, "Bearer router-1"),
			&skipperv1.RouterIdentity{Node: "node1", Pod: "skipper-system/r2"}, true, codes.PermissionDenied},
		{"forwarded by a replica without the caller's token", as(t, a, "ctl"), r1, true, codes.Unauthenticated},
		{"forwarded by a replica with a forged caller token", as(t, a, "ctl", trust.HeaderCaller, "Bearer forged"), r1, true, codes.Unauthenticated},
		{"forwarded by a router", as(t, a, "router-1", trust.HeaderCaller, "Bearer router-1"), r1, true, codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(a.asRouter(tc.ctx, tc.rid, tc.forwarded)); got != tc.code {
				t.Errorf("asRouter: %s (%v), want %s", got, a.asRouter(tc.ctx, tc.rid, tc.forwarded), tc.code)
			}
		})
	}
	// --auth none: nil allows all.
	var none *authz
	if err := none.asRouter(t.Context(), r1, true); err != nil || none.state(t.Context()) != nil {
		t.Errorf("nil authz refused: %v", err)
	}
}

func TestAuthzState(t *testing.T) {
	a := testAuthz()
	for tok, want := range map[string]codes.Code{"ctl": codes.OK, "debugger": codes.OK, "router-1": codes.PermissionDenied, "tenant": codes.PermissionDenied} {
		if got := status.Code(a.state(as(t, a, tok))); got != want {
			t.Errorf("GetState by %s: %s, want %s", tok, got, want)
		}
	}
	a.debugGroup = ""
	if got := status.Code(a.state(as(t, a, "debugger"))); got != codes.PermissionDenied {
		t.Errorf("GetState by the debug group with none set: %s", got)
	}
}

func TestCallerTokenPassedOn(t *testing.T) {
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(trust.HeaderAuthorization, "Bearer router-1"))
	out, err := callerToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md, _ := metadata.FromOutgoingContext(out)
	if got := md.Get(trust.HeaderCaller); len(got) != 1 || got[0] != "Bearer router-1" {
		t.Errorf("forwarded caller token %v", got)
	}
	if out, _ := callerToken(t.Context()); out != t.Context() {
		t.Error("no token: metadata added")
	}
}

func TestParseSARef(t *testing.T) {
	if r, err := parseSARef("ns/name"); err != nil || r != (saRef{"ns", "name"}) {
		t.Errorf("parseSARef = %v, %v", r, err)
	}
	for _, bad := range []string{"", "ns", "/name", "ns/", "a/b/c"} {
		if _, err := parseSARef(bad); err == nil {
			t.Errorf("parseSARef(%q): no error", bad)
		}
	}
}
