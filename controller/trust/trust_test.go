package trust

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// jwt is an unsigned token with exp (the review, faked, vouches for it).
func jwt(exp time.Time, sub string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc(fmt.Appendf(nil, `{"exp":%d,"sub":%q}`, exp.Unix(), sub)) + ".sig"
}

// fakeReviewer answers from a table and counts reviews; down fails them.
type fakeReviewer struct {
	users   map[string]authenticationv1.UserInfo
	reviews atomic.Int64
	down    atomic.Bool
}

func (f *fakeReviewer) Review(_ context.Context, token string) (authenticationv1.TokenReviewStatus, error) {
	f.reviews.Add(1)
	if f.down.Load() {
		return authenticationv1.TokenReviewStatus{}, errors.New("connection refused")
	}
	u, ok := f.users[token]
	if !ok {
		return authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}, nil
	}
	return authenticationv1.TokenReviewStatus{Authenticated: true, User: u, Audiences: []string{Audience}}, nil
}

func routerUser(pod, node string) authenticationv1.UserInfo {
	return authenticationv1.UserInfo{
		Username: "system:serviceaccount:skipper-system:skipper-noderouter",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:skipper-system", "system:authenticated"},
		Extra: map[string]authenticationv1.ExtraValue{
			extraPodName: {pod}, extraPodUID: {"uid-" + pod}, extraNodeName: {node},
		},
	}
}

func TestAuthenticateCachesUntilExpiry(t *testing.T) {
	now := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	tok := jwt(now.Add(10*time.Minute), "router")
	f := &fakeReviewer{users: map[string]authenticationv1.UserInfo{tok: routerUser("r1", "node1")}}
	a := NewAuthenticator(f, 0)
	a.now = func() time.Time { return now }

	id, err := a.Authenticate(t.Context(), tok)
	if err != nil {
		t.Fatal(err)
	}
	want := Identity{User: "system:serviceaccount:skipper-system:skipper-noderouter", Namespace: "skipper-system",
		ServiceAccount: "skipper-noderouter", Pod: "r1", PodUID: "uid-r1", Node: "node1", Expires: now.Add(10 * time.Minute)}
	if id.User != want.User || id.Namespace != want.Namespace || id.ServiceAccount != want.ServiceAccount ||
		id.Pod != want.Pod || id.PodUID != want.PodUID || id.Node != want.Node || !id.Expires.Equal(want.Expires) {
		t.Errorf("identity %+v, want %+v", id, want)
	}
	if !id.IsServiceAccount("skipper-system", "skipper-noderouter") || id.IsServiceAccount("default", "skipper-noderouter") || !id.InGroup("system:authenticated") {
		t.Errorf("identity predicates wrong for %+v", id)
	}

	// Cached: the API server may go away, the review holds until expiry.
	f.down.Store(true)
	now = now.Add(9 * time.Minute)
	if _, err := a.Authenticate(t.Context(), tok); err != nil {
		t.Errorf("cached review refused while the API server is down: %v", err)
	}
	if n := f.reviews.Load(); n != 1 {
		t.Errorf("%d reviews, want 1 (cached)", n)
	}
	// Expired: reviewed again, and that fails while the API server is down.
	now = now.Add(2 * time.Minute)
	if _, err := a.Authenticate(t.Context(), tok); !errors.Is(err, ErrUnavailable) {
		t.Errorf("expired token with the API server down: %v, want ErrUnavailable", err)
	}
}

func TestAuthenticateRefusals(t *testing.T) {
	now := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	f := &fakeReviewer{users: map[string]authenticationv1.UserInfo{"opaque": {Username: "alice"}}}
	a := NewAuthenticator(f, 0)
	a.now = func() time.Time { return now }
	if _, err := a.Authenticate(t.Context(), ""); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("no token: %v", err)
	}
	if f.reviews.Load() != 0 {
		t.Error("an empty token was reviewed")
	}
	for range 3 {
		if _, err := a.Authenticate(t.Context(), "forged"); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("forged token: %v", err)
		}
	}
	if n := f.reviews.Load(); n != 1 {
		t.Errorf("a refused token reviewed %d times within deniedTTL, want 1", n)
	}
	now = now.Add(deniedTTL)
	_, _ = a.Authenticate(t.Context(), "forged")
	if n := f.reviews.Load(); n != 2 {
		t.Errorf("a refused token reviewed %d times after deniedTTL, want 2", n)
	}
	// A non-JWT token is kept opaqueTTL; a user that is not a
	// ServiceAccount has no pod or node.
	id, err := a.Authenticate(t.Context(), "opaque")
	if err != nil || id.User != "alice" || id.ServiceAccount != "" || id.Pod != "" || !id.Expires.IsZero() {
		t.Errorf("opaque token: %+v, %v", id, err)
	}
	// Extra fields of a user that is not a ServiceAccount are not read.
	if id := identityOf(authenticationv1.UserInfo{Username: "bob", Extra: map[string]authenticationv1.ExtraValue{extraNodeName: {"node1"}}}); id.Node != "" {
		t.Errorf("node %q read for a user", id.Node)
	}
	// A review for another audience is refused.
	e := reviewed(authenticationv1.TokenReviewStatus{Authenticated: true, User: routerUser("r", "n"), Audiences: []string{"api"}}, "x", now)
	if !errors.Is(e.err, ErrUnauthenticated) {
		t.Errorf("a token for another audience: %v", e.err)
	}
}

func TestAuthenticateBounded(t *testing.T) {
	now := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	f := &fakeReviewer{users: map[string]authenticationv1.UserInfo{}}
	for i := range 20 {
		f.users[fmt.Sprint("t", i)] = authenticationv1.UserInfo{Username: fmt.Sprint("u", i)}
	}
	a := NewAuthenticator(f, 8)
	a.now = func() time.Time { return now }
	for i := range 20 {
		if _, err := a.Authenticate(t.Context(), fmt.Sprint("t", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.Len(); n > 8 {
		t.Errorf("%d reviews kept, want at most 8", n)
	}
}

func TestTokenExpiry(t *testing.T) {
	exp := time.Unix(1_800_000_000, 0)
	if got, ok := tokenExpiry(jwt(exp, "x")); !ok || !got.Equal(exp) {
		t.Errorf("tokenExpiry = %s, %v", got, ok)
	}
	for _, bad := range []string{"", "a.b", "a.!!!.c", "a." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"x"}`)) + ".c",
		"a." + base64.RawURLEncoding.EncodeToString([]byte(`{"exp":"soon"}`)) + ".c"} {
		if _, ok := tokenExpiry(bad); ok {
			t.Errorf("tokenExpiry(%q) read an expiry", bad)
		}
	}
}

func TestTokenFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "token")
	tf := NewTokenFile(p)
	if _, err := tf.GetRequestMetadata(t.Context()); err == nil {
		t.Error("a missing token file: no error")
	}
	if err := os.WriteFile(p, []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	md, err := tf.GetRequestMetadata(t.Context())
	if err != nil || md[HeaderAuthorization] != "Bearer tok-1" {
		t.Errorf("metadata %v, %v", md, err)
	}
	if md, err := NewTokenFile("").GetRequestMetadata(t.Context()); err != nil || len(md) != 0 {
		t.Errorf("no path: %v, %v; want no metadata", md, err)
	}
	if tf.RequireTransportSecurity() {
		t.Error("TLS required")
	}
}

// TestInterceptors runs a real gRPC server with the interceptors and the
// health service, called with no token, a bad one, a good one, and the
// health service exempt.
func TestInterceptors(t *testing.T) {
	good := jwt(time.Now().Add(time.Hour), "router")
	f := &fakeReviewer{users: map[string]authenticationv1.UserInfo{good: routerUser("r1", "node1")}}
	a := NewAuthenticator(f, 0)
	skip := func(m string) bool { return m == "/grpc.health.v1.Health/Check" }
	srv := grpc.NewServer(grpc.UnaryInterceptor(a.UnaryInterceptor(skip)), grpc.StreamInterceptor(a.StreamInterceptor(skip)))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	cl := healthpb.NewHealthClient(cc)
	call := func(md ...string) error {
		ctx := metadata.AppendToOutgoingContext(t.Context(), md...)
		// List is authenticated; a stream (Watch) too.
		if _, err := cl.List(ctx, &healthpb.HealthListRequest{}); err != nil {
			return err
		}
		w, err := cl.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		_, err = w.Recv()
		return err
	}
	for _, tc := range []struct {
		name string
		md   []string
		code codes.Code
	}{
		{"no token", nil, codes.Unauthenticated},
		{"not bearer", []string{HeaderAuthorization, "Basic xyz"}, codes.Unauthenticated},
		{"a forged token", []string{HeaderAuthorization, "Bearer forged"}, codes.Unauthenticated},
		{"a reviewed token", []string{HeaderAuthorization, "Bearer " + good}, codes.OK},
	} {
		if got := status.Code(call(tc.md...)); got != tc.code {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.code)
		}
	}
	if _, err := cl.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("the health check is exempt: %v", err)
	}
	f.down.Store(true)
	if got := status.Code(call(HeaderAuthorization, "Bearer never-seen")); got != codes.Unavailable {
		t.Errorf("a new token while the API server is down: %s, want Unavailable", got)
	}
	if got := status.Code(call(HeaderAuthorization, "Bearer "+good)); got != codes.OK {
		t.Errorf("a cached token while the API server is down: %s, want OK", got)
	}
}

func TestBearerToken(t *testing.T) {
	in := func(kv ...string) context.Context {
		return metadata.NewIncomingContext(t.Context(), metadata.Pairs(kv...))
	}
	if tok, err := BearerToken(in(HeaderCaller, "bearer  abc "), HeaderCaller); err != nil || tok != "abc" {
		t.Errorf("BearerToken = %q, %v", tok, err)
	}
	if tok, err := BearerToken(t.Context(), HeaderAuthorization); err != nil || tok != "" {
		t.Errorf("no metadata: %q, %v", tok, err)
	}
	if _, err := BearerToken(in(HeaderAuthorization, "Bearer a", HeaderAuthorization, "Bearer b"), HeaderAuthorization); err == nil {
		t.Error("two tokens: no error")
	}
}

func TestSidecarAccess(t *testing.T) {
	cs := fake.NewClientset()
	var asked atomic.Int64
	var down atomic.Bool
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		asked.Add(1)
		if down.Load() {
			return true, nil, errors.New("connection refused")
		}
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		ra := sar.Spec.ResourceAttributes
		ok := sar.Spec.User == "system:serviceaccount:shop:caller" && ra.Namespace == "shop" &&
			ra.Group == SidecarGroup && ra.Resource == SidecarResource && ra.Verb == SidecarVerb
		sar.Status.Allowed = ok
		return true, sar, nil
	})
	now := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	s := &SidecarAccess{CS: cs, now: func() time.Time { return now }}
	caller := Identity{User: "system:serviceaccount:shop:caller", Namespace: "shop", ServiceAccount: "caller"}
	other := Identity{User: "system:serviceaccount:shop:web", Namespace: "shop", ServiceAccount: "web"}
	if ok, err := s.Allowed(t.Context(), caller); err != nil || !ok {
		t.Errorf("granted caller: %v, %v", ok, err)
	}
	if ok, err := s.Allowed(t.Context(), other); err != nil || ok {
		t.Errorf("other caller: %v, %v", ok, err)
	}
	if _, _ = s.Allowed(t.Context(), caller); asked.Load() != 2 {
		t.Errorf("%d reviews, want 2 (the answer kept)", asked.Load())
	}
	// Past accessTTL with the API server down: the kept answer holds; a
	// caller never asked about cannot be answered.
	down.Store(true)
	now = now.Add(2 * accessTTL)
	if ok, err := s.Allowed(t.Context(), caller); err != nil || !ok {
		t.Errorf("kept answer with the API server down: %v, %v", ok, err)
	}
	if _, err := s.Allowed(t.Context(), Identity{User: "system:serviceaccount:x:y"}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("new caller with the API server down: %v", err)
	}
}
