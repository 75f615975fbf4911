package trust

import (
	"context"
	"crypto"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"sync"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// jwt is an unsigned token with exp (the review, faked, vouches for it).
func jwt(exp time.Time, sub string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc(fmt.Appendf(nil, `{"aud":["skipper"],"exp":%d,"sub":%q}`, exp.Unix(), sub)) + ".sig"
}

// fakeReviewer answers from a table and counts reviews; down fails them.
type fakeReviewer struct {
	users   map[string]authenticationv1.UserInfo
	reviews atomic.Int64
	down    atomic.Bool
	gate    chan struct{} // when set, each review waits for a receive from it
	mu      sync.Mutex    // guards users while reviews may run in the background
}

func (f *fakeReviewer) Review(_ context.Context, token string) (authenticationv1.TokenReviewStatus, error) {
	f.reviews.Add(1)
	if f.gate != nil {
		<-f.gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
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
	t.Parallel()
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

	// Fresh: taken from the cache.
	now = now.Add(30 * time.Second)
	if _, err := a.Authenticate(t.Context(), tok); err != nil || f.reviews.Load() != 1 {
		t.Errorf("a fresh review: %v, %d reviews (want 1)", err, f.reviews.Load())
	}
	// Past freshTTL the API server is asked again; while it is away, the
	// review holds until the token expires, and it is not asked again
	// within downFor.
	f.down.Store(true)
	now = now.Add(8 * time.Minute)
	for range 3 {
		if _, err := a.Authenticate(t.Context(), tok); err != nil {
			t.Errorf("cached review refused while the API server is down: %v", err)
		}
	}
	if n := f.reviews.Load(); n != 2 {
		t.Errorf("%d reviews, want 2 (one tried, then none within downFor)", n)
	}
	// Expired: refused, without asking.
	now = now.Add(2 * time.Minute)
	if _, err := a.Authenticate(t.Context(), tok); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("expired token with the API server down: %v, want ErrUnauthenticated", err)
	}
}

// TestAuthenticateRefreshesInBackground: a review past refreshAfter is
// answered from the cache at once and reviewed again in the background,
// once at a time; the new review extends it, a refusal ends it.
func TestAuthenticateRefreshesInBackground(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	now := t0
	tok := jwt(t0.Add(time.Hour), "router")
	f := &fakeReviewer{users: map[string]authenticationv1.UserInfo{tok: routerUser("r1", "node1")}}
	a := NewAuthenticator(f, 0)
	a.now = func() time.Time { return now }
	if _, err := a.Authenticate(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	f.gate = make(chan struct{})
	now = t0.Add(refreshAfter + 10*time.Second)
	for range 3 {
		// The review blocks on the gate: these return regardless.
		if _, err := a.Authenticate(t.Context(), tok); err != nil {
			t.Fatalf("a review past refreshAfter: %v", err)
		}
	}
	f.gate <- struct{}{}
	a.wg.Wait()
	if n := f.reviews.Load(); n != 2 {
		t.Fatalf("%d reviews, want 2 (the first, one refresh for three calls)", n)
	}
	// Past the first review's freshTTL, the refresh's answers.
	now = t0.Add(freshTTL + 5*time.Second)
	if _, err := a.Authenticate(t.Context(), tok); err != nil || f.reviews.Load() != 2 {
		t.Errorf("after the refresh: %v, %d reviews; want the cache, 2", err, f.reviews.Load())
	}
	// The pod is deleted: the next refresh refuses the token, and calls
	// after it are refused without waiting for a review.
	f.mu.Lock()
	delete(f.users, tok)
	f.mu.Unlock()
	now = now.Add(refreshAfter)
	if _, err := a.Authenticate(t.Context(), tok); err != nil {
		t.Fatalf("the call that starts the refresh: %v", err)
	}
	f.gate <- struct{}{}
	a.wg.Wait()
	if _, err := a.Authenticate(t.Context(), tok); !errors.Is(err, ErrUnauthenticated) || f.reviews.Load() != 3 {
		t.Errorf("after a refusing refresh: %v, %d reviews; want ErrUnauthenticated, 3", err, f.reviews.Load())
	}
	// A refresh whose review was evicted meanwhile (and perhaps refused
	// by a call's own review) brings nothing back.
	f.mu.Lock()
	f.users[tok] = routerUser("r1", "node1")
	f.mu.Unlock()
	now = now.Add(deniedTTL)
	f.gate = nil
	if _, err := a.Authenticate(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	f.gate = make(chan struct{})
	now = now.Add(refreshAfter)
	if _, err := a.Authenticate(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	clear(a.cache)
	a.mu.Unlock()
	f.gate <- struct{}{}
	a.wg.Wait()
	if n := a.Len(); n != 0 {
		t.Errorf("a refresh restored %d evicted reviews", n)
	}
	// Closed: no refresh starts.
	f.gate = nil
	f.mu.Lock()
	f.users[tok] = routerUser("r1", "node1")
	f.mu.Unlock()
	now = now.Add(deniedTTL)
	if _, err := a.Authenticate(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	a.Close()
	now = now.Add(refreshAfter)
	before := f.reviews.Load()
	if _, err := a.Authenticate(t.Context(), tok); err != nil || f.reviews.Load() != before {
		t.Errorf("after Close: %v, %d reviews, want the cache and %d", err, f.reviews.Load(), before)
	}
}

func TestAuthenticateRefusals(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	forged := jwt(now.Add(time.Hour), "forged")
	f := &fakeReviewer{users: map[string]authenticationv1.UserInfo{}}
	a := NewAuthenticator(f, 0)
	a.now = func() time.Time { return now }
	// Refused without a review: no token, not a JWT, another audience, expired.
	for name, tok := range map[string]string{
		"no token": "", "not a JWT": "opaque",
		"another audience": "a." + base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"aud":["api"],"exp":%d}`, now.Add(time.Hour).Unix())) + ".s",
		"expired":          jwt(now.Add(-time.Second), "old"),
	} {
		if _, err := a.Authenticate(t.Context(), tok); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: %v, want ErrUnauthenticated", name, err)
		}
	}
	if n := f.reviews.Load(); n != 0 {
		t.Errorf("%d reviews of tokens that cannot be ours, want 0", n)
	}
	for range 3 {
		if _, err := a.Authenticate(t.Context(), forged); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("forged token: %v", err)
		}
	}
	if n := f.reviews.Load(); n != 1 {
		t.Errorf("a refused token reviewed %d times within deniedTTL, want 1", n)
	}
	now = now.Add(deniedTTL)
	_, _ = a.Authenticate(t.Context(), forged)
	if n := f.reviews.Load(); n != 2 {
		t.Errorf("a refused token reviewed %d times after deniedTTL, want 2", n)
	}
	// Refused once, it is never verified locally, whatever the keys say:
	// with the API server down it stays refused.
	a.VerifyLocally(&KeySet{issuer: "x", keys: map[string]crypto.PublicKey{"k": nil}})
	f.down.Store(true)
	now = now.Add(deniedTTL)
	if _, err := a.Authenticate(t.Context(), forged); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("a refused token with the API server down: %v, want still refused", err)
	}
	// A user that is not a ServiceAccount has no pod or node.
	if id := identityOf(authenticationv1.UserInfo{Username: "bob", Extra: map[string]authenticationv1.ExtraValue{extraNodeName: {"node1"}}}); id.Node != "" {
		t.Errorf("node %q read for a user", id.Node)
	}
	// A review for another audience, or for none (an authenticator that
	// does not know audiences), is a refusal.
	for _, auds := range [][]string{{"api"}, nil} {
		if _, err := reviewed(authenticationv1.TokenReviewStatus{Authenticated: true, User: routerUser("r", "n"), Audiences: auds}, "x"); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("a review for audiences %v: %v", auds, err)
		}
	}
}

// TestAuthenticateAPIErrors: only the API server being unable to answer
// lets a cached review or the keys decide; its refusing the controller
// (RBAC) does not, and a caller's own deadline never decides the path.
func TestAuthenticateAPIErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		down bool
	}{
		{errors.New("dial tcp: connection refused"), true},
		{apierrors.NewServiceUnavailable("x"), true},
		{apierrors.NewTooManyRequests("x", 1), true},
		{apierrors.NewInternalError(errors.New("x")), true},
		{apierrors.NewTimeoutError("x", 1), true},
		{context.DeadlineExceeded, true},
		{apierrors.NewForbidden(schema.GroupResource{Group: "authentication.k8s.io", Resource: "tokenreviews"}, "", errors.New("rbac")), false},
		{apierrors.NewBadRequest("x"), false},
		{apierrors.NewUnauthorized("x"), false},
	} {
		if got := apiUnavailable(fmt.Errorf("TokenReview: %w", tc.err)); got != tc.down {
			t.Errorf("apiUnavailable(%v) = %v, want %v", tc.err, got, tc.down)
		}
	}
	// The caller's cancelled context does not fail the review.
	tok := jwt(time.Now().Add(time.Hour), "router")
	a := NewAuthenticator(ctxReviewer{routerUser("r1", "node1")}, 0)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := a.Authenticate(ctx, tok); err != nil {
		t.Errorf("a caller's cancelled context failed the review: %v", err)
	}
}

// ctxReviewer fails when the context it is given is done, as a real
// client does.
type ctxReviewer struct{ u authenticationv1.UserInfo }

func (r ctxReviewer) Review(ctx context.Context, _ string) (authenticationv1.TokenReviewStatus, error) {
	if err := ctx.Err(); err != nil {
		return authenticationv1.TokenReviewStatus{}, err
	}
	return authenticationv1.TokenReviewStatus{Authenticated: true, User: r.u, Audiences: []string{Audience}}, nil
}

func TestAuthenticateBounded(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	f := &fakeReviewer{users: map[string]authenticationv1.UserInfo{}}
	tok := func(i int) string { return jwt(now.Add(time.Hour), fmt.Sprint("t", i)) }
	for i := range 20 {
		f.users[tok(i)] = authenticationv1.UserInfo{Username: fmt.Sprint("u", i)}
	}
	a := NewAuthenticator(f, 8)
	a.now = func() time.Time { return now }
	for i := range 20 {
		if _, err := a.Authenticate(t.Context(), tok(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.Len(); n > 8 {
		t.Errorf("%d reviews kept, want at most 8", n)
	}
	// Refusals are kept apart: a flood of them evicts no review.
	for i := range 100 {
		_, _ = a.Authenticate(t.Context(), jwt(now.Add(time.Hour), fmt.Sprint("junk", i)))
	}
	reviews := f.reviews.Load()
	if _, err := a.Authenticate(t.Context(), tok(19)); err != nil || f.reviews.Load() != reviews {
		t.Errorf("the latest review after a flood of refusals: %v, %d more reviews (want 0)", err, f.reviews.Load()-reviews)
	}
}

func TestTokenExpiry(t *testing.T) {
	t.Parallel()
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

// TestInterceptors runs a real gRPC server with the interceptors and the
// health service, called with no token, a bad one, a good one, and the
// health service exempt.
func TestInterceptors(t *testing.T) {
	t.Parallel()
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
	if got := status.Code(call(HeaderAuthorization, "Bearer "+jwt(time.Now().Add(time.Hour), "never-seen"))); got != codes.Unavailable {
		t.Errorf("a new token while the API server is down: %s, want Unavailable", got)
	}
	if got := status.Code(call(HeaderAuthorization, "Bearer "+good)); got != codes.OK {
		t.Errorf("a cached token while the API server is down: %s, want OK", got)
	}
}

func TestBearerToken(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
