package controller

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"skipper.dev/skipper/controller/trust"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// tableReviewer answers TokenReviews from a table of token names (tok).
type tableReviewer map[string]authenticationv1.UserInfo

func (r tableReviewer) Review(_ context.Context, token string) (authenticationv1.TokenReviewStatus, error) {
	for name, u := range r {
		if tok(name) == token {
			return authenticationv1.TokenReviewStatus{Authenticated: true, User: u, Audiences: []string{trust.Audience}}, nil
		}
	}
	return authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}, nil
}

// tok is an unsigned JWT for audience skipper named name, valid until 2100
// (the fake review vouches for it).
func tok(name string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." +
		enc(fmt.Appendf(nil, `{"aud":["skipper"],"exp":4102444800,"sub":%q}`, name)) + ".sig"
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
		routerSA: saRef{"skipper-system", "skipper-noderouter"}, controller: saRef{"skipper-system", "skipper-controller"}, debugGroup: "skipper:debug"}
}

// as is ctx as the interceptor leaves it for token, with extra metadata.
func as(t *testing.T, a *authz, token string, md ...string) context.Context {
	t.Helper()
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(append([]string{trust.HeaderAuthorization, "Bearer " + tok(token)}, md...)...))
	id, err := a.auth.Authenticate(ctx, tok(token))
	if err != nil {
		t.Fatalf("authenticate %s: %v", token, err)
	}
	return trust.WithIdentity(ctx, id)
}

func TestAuthzRouter(t *testing.T) {
	t.Parallel()
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
		{"forwarded by a replica for the router", as(t, a, "ctl", trust.HeaderCaller, "Bearer "+tok("router-1")), r1, true, codes.OK},
		{"forwarded by a replica, the router's token naming another", as(t, a, "ctl", trust.HeaderCaller, "Bearer "+tok("router-1")),
			&skipperv1.RouterIdentity{Node: "node1", Pod: "skipper-system/r2"}, true, codes.PermissionDenied},
		{"forwarded by a replica without the caller's token", as(t, a, "ctl"), r1, true, codes.Unauthenticated},
		{"forwarded by a replica with a forged caller token", as(t, a, "ctl", trust.HeaderCaller, "Bearer "+tok("forged")), r1, true, codes.Unauthenticated},
		{"forwarded by a router", as(t, a, "router-1", trust.HeaderCaller, "Bearer "+tok("router-1")), r1, true, codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(a.asRouter(tc.ctx, tc.rid, tc.forwarded)); got != tc.code {
				t.Errorf("asRouter: %s (%v), want %s", got, a.asRouter(tc.ctx, tc.rid, tc.forwarded), tc.code)
			}
		})
	}
	// A sidecar router's calls come from its own pod, as its token says;
	// a DaemonSet router's name the pod they came from themselves.
	c, err := a.router(as(t, a, "sidecar"), &skipperv1.RouterIdentity{Node: "node2", Pod: "shop/app-1"}, false)
	if err != nil || c.GetNamespace() != "shop" || c.GetServiceAccount() != "caller" || c.GetPod() != "shop/app-1" {
		t.Errorf("sidecar's caller = %v, %v; want shop/caller, pod shop/app-1", c, err)
	}
	if c, err := a.router(as(t, a, "router-1"), r1, false); c != nil || err != nil {
		t.Errorf("DaemonSet router's caller = %v, %v; want none", c, err)
	}
	// --auth none: nil allows all.
	var none *authz
	if err := none.asRouter(t.Context(), r1, true); err != nil || none.state(t.Context()) != nil {
		t.Errorf("nil authz refused: %v", err)
	}
}

func TestAuthzState(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
	if r, err := parseSARef("ns/name"); err != nil || r != (saRef{"ns", "name"}) {
		t.Errorf("parseSARef = %v, %v", r, err)
	}
	for _, bad := range []string{"", "ns", "/name", "ns/", "a/b/c"} {
		if _, err := parseSARef(bad); err == nil {
			t.Errorf("parseSARef(%q): no error", bad)
		}
	}
}

// TestForwardedCallerReviewedByOwner runs two replicas with --auth
// tokenreview on the fake API server's TokenReview: a router's call to the
// replica that does not own the function is forwarded with the replica's
// own token and the router's, the owner reviews both and answers; a
// workload's call is refused at the first replica, and one naming another
// router at the owner.
func TestForwardedCallerReviewedByOwner(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	users := tableReviewer{
		"router-1": saUser("skipper-system", "skipper-noderouter", "r1", "node1"),
		"ctl":      saUser("skipper-system", "skipper-controller", "c0", "node1"),
		"tenant":   saUser("default", "default", "web-1", "node1"),
	}
	var reviews atomic.Int64
	e.core.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		reviews.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		st, _ := users.Review(t.Context(), tr.Spec.Token)
		tr.Status = st
		return true, tr, nil
	})
	e.core.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, a.(k8stesting.CreateAction).GetObject(), nil // nobody is granted skipper-sidecar-router
	})
	ctlToken := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(ctlToken, []byte(tok("ctl")), 0o600); err != nil {
		t.Fatal(err)
	}
	withAuth := func(c *Config) { c.Auth, c.TokenFile = authTokenReview, ctlToken }
	a, name := forwardingPair(t, e, withAuth)
	call := func(token string, rid *skipperv1.RouterIdentity) (*skipperv1.GetInstanceResponse, error) {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), trust.HeaderAuthorization, "Bearer "+tok(token)), 5*time.Second)
		defer cancel()
		return a.client.GetInstance(ctx, &skipperv1.GetInstanceRequest{Function: &skipperv1.FunctionRef{Namespace: "default", Name: name}, Router: rid})
	}
	r1 := &skipperv1.RouterIdentity{Node: "node1", Pod: "skipper-system/r1"}
	resp, err := call("router-1", r1)
	if err != nil {
		t.Fatalf("the router's call through A: %v", err)
	}
	if resp.GetOwner() != "ctl-b" {
		t.Errorf("owner %q, want ctl-b (forwarded)", resp.GetOwner())
	}
	if n := reviews.Load(); n < 3 {
		t.Errorf("%d reviews, want the router's at A, and at B the replica's and the router's", n)
	}
	if _, err := call("tenant", &skipperv1.RouterIdentity{Node: "node1", Pod: "default/web-1"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a workload's call: %v, want PermissionDenied", err)
	}
	if _, err := call("router-1", &skipperv1.RouterIdentity{Node: "node1", Pod: "skipper-system/r2"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the router naming another: %v, want PermissionDenied", err)
	}
	_, ma := httpGetBody(t, a.httpAddr, "/metrics")
	if !strings.Contains(ma, `skipper_controller_auth_refusals_total{code="PermissionDenied"} 2`) {
		t.Errorf("A's metrics lack 2 PermissionDenied refusals:\n%s", grepLines(ma, "auth_refusals"))
	}
}

// grepLines returns the lines of s containing sub.
func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestEveryMethodHasARule: every method of the Controller service has an
// authorization rule; one added without is refused by denyUnruled.
func TestEveryMethodHasARule(t *testing.T) {
	t.Parallel()
	desc := skipperv1.Controller_ServiceDesc
	var methods []string
	for _, m := range desc.Methods {
		methods = append(methods, "/"+desc.ServiceName+"/"+m.MethodName)
	}
	for _, s := range desc.Streams {
		methods = append(methods, "/"+desc.ServiceName+"/"+s.StreamName)
	}
	for _, m := range methods {
		if !authorizedMethods[m] {
			t.Errorf("%s has no rule in authorizedMethods", m)
		}
	}
	if len(methods) != len(authorizedMethods) {
		t.Errorf("%d methods, %d rules", len(methods), len(authorizedMethods))
	}
	du, _ := denyUnruled(func(m string) bool { return strings.HasPrefix(m, healthMethod) })
	call := func(m string) error {
		_, err := du(t.Context(), nil, &grpc.UnaryServerInfo{FullMethod: m}, func(context.Context, any) (any, error) { return nil, nil })
		return err
	}
	if status.Code(call("/skipper.v1.Controller/NewThing")) != codes.PermissionDenied || call(skipperv1.Controller_GetState_FullMethodName) != nil ||
		call("/grpc.health.v1.Health/Check") != nil {
		t.Error("denyUnruled lets an unruled method through, or refuses a ruled one")
	}
}

// TestTokenExpiryEndsStreams: a Connect stream ends when the token it was
// authorised with expires (tokenExpiry's channel), never with auth off or
// a token without an expiry.
func TestTokenExpiryEndsStreams(t *testing.T) {
	t.Parallel()
	soon := trust.WithIdentity(t.Context(), trust.Identity{User: "r", Expires: time.Now().Add(20 * time.Millisecond)})
	select {
	case <-tokenExpiry(soon, true):
	case <-time.After(5 * time.Second):
		t.Fatal("the stream's token expired and its channel did not fire")
	}
	if tokenExpiry(soon, false) != nil {
		t.Error("auth off: an expiry")
	}
	if tokenExpiry(trust.WithIdentity(t.Context(), trust.Identity{User: "r"}), true) != nil || tokenExpiry(t.Context(), true) != nil {
		t.Error("no expiry, or no identity: an expiry")
	}
}
