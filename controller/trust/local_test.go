package trust

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
)

const testIssuer = "https://kubernetes.default.svc.cluster.local"

var b64 = base64.RawURLEncoding.EncodeToString

// signer mints ServiceAccount tokens as the API server does.
type signer struct {
	kid string
	alg string
	key crypto.Signer
}

func (s signer) jwk() map[string]string {
	switch k := s.key.Public().(type) {
	case *rsa.PublicKey:
		return map[string]string{"kty": "RSA", "kid": s.kid, "alg": "RS256", "n": b64(k.N.Bytes()), "e": b64([]byte{1, 0, 1})}
	case *ecdsa.PublicKey:
		x, y := make([]byte, 32), make([]byte, 32)
		k.X.FillBytes(x)
		k.Y.FillBytes(y)
		return map[string]string{"kty": "EC", "kid": s.kid, "alg": "ES256", "crv": "P-256", "x": b64(x), "y": b64(y)}
	}
	panic("key")
}

func (s signer) token(t *testing.T, claims map[string]any) string {
	t.Helper()
	h, _ := json.Marshal(map[string]string{"alg": s.alg, "kid": s.kid})
	p, _ := json.Marshal(claims)
	in := b64(h) + "." + b64(p)
	sum := sha256.Sum256([]byte(in))
	var sig []byte
	switch k := s.key.(type) {
	case *rsa.PrivateKey:
		var err error
		if sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, sum[:]); err != nil {
			t.Fatal(err)
		}
	case *ecdsa.PrivateKey:
		r, ss, err := ecdsa.Sign(rand.Reader, k, sum[:])
		if err != nil {
			t.Fatal(err)
		}
		sig = make([]byte, 64)
		r.FillBytes(sig[:32])
		ss.FillBytes(sig[32:])
	}
	return in + "." + b64(sig)
}

func routerClaims(now time.Time) map[string]any {
	return map[string]any{
		"iss": testIssuer, "aud": []string{Audience}, "exp": now.Add(10 * time.Minute).Unix(), "nbf": now.Add(-time.Second).Unix(),
		"sub": "system:serviceaccount:skipper-system:skipper-noderouter",
		"kubernetes.io": map[string]any{"namespace": "skipper-system", "serviceaccount": map[string]any{"name": "skipper-noderouter"},
			"pod": map[string]any{"name": "r1", "uid": "u1"}, "node": map[string]any{"name": "node1"}},
	}
}

func testKeys(t *testing.T) (*KeySet, signer, signer) {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rs, es := signer{"rsa-1", "RS256", rk}, signer{"ec-1", "ES256", ek}
	jwks, _ := json.Marshal(map[string]any{"keys": []any{rs.jwk(), es.jwk()}})
	var k KeySet
	if err := k.Load([]byte(`{"issuer":"`+testIssuer+`"}`), jwks); err != nil {
		t.Fatal(err)
	}
	return &k, rs, es
}

func TestKeySetVerify(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	k, rs, es := testKeys(t)
	for _, s := range []signer{rs, es} {
		id, err := k.Verify(s.token(t, routerClaims(now)), now)
		if err != nil {
			t.Fatalf("%s: %v", s.alg, err)
		}
		if !id.IsServiceAccount("skipper-system", "skipper-noderouter") || id.Pod != "r1" || id.PodUID != "u1" || id.Node != "node1" ||
			!id.InGroup("system:serviceaccounts:skipper-system") || !id.Expires.Equal(now.Add(10*time.Minute).Truncate(time.Second)) {
			t.Errorf("%s: identity %+v", s.alg, id)
		}
	}
	with := func(f func(map[string]any)) map[string]any { c := routerClaims(now); f(c); return c }
	good := rs.token(t, routerClaims(now))
	parts := strings.Split(good, ".")
	for _, tc := range []struct{ name, token, want string }{
		{"another audience", rs.token(t, with(func(c map[string]any) { c["aud"] = []string{"api"} })), "audience"},
		{"one audience as a string", rs.token(t, with(func(c map[string]any) { c["aud"] = "api" })), "audience"},
		{"expired", rs.token(t, with(func(c map[string]any) { c["exp"] = now.Unix() })), "expired"},
		{"not valid yet", rs.token(t, with(func(c map[string]any) { c["nbf"] = now.Add(time.Minute).Unix() })), "not valid yet"},
		{"another issuer", rs.token(t, with(func(c map[string]any) { c["iss"] = "https://evil" })), "issuer"},
		{"a subject that is not its ServiceAccount", rs.token(t, with(func(c map[string]any) { c["sub"] = "system:serviceaccount:kube-system:admin" })), "not a ServiceAccount"},
		{"a payload changed after signing", parts[0] + "." + b64([]byte(`{"iss":"`+testIssuer+`","aud":["skipper"],"exp":9999999999,"sub":"system:serviceaccount:a:b","kubernetes.io":{"namespace":"a","serviceaccount":{"name":"b"}}}`)) + "." + parts[2], "bad signature"},
		{"alg none", b64([]byte(`{"alg":"none","kid":"rsa-1"}`)) + "." + parts[1] + ".", "bad signature"},
		{"an RSA key with ES256", b64([]byte(`{"alg":"ES256","kid":"rsa-1"}`)) + "." + parts[1] + "." + parts[2], "bad signature"},
		{"an unknown key", signer{"rsa-2", "RS256", rs.key}.token(t, routerClaims(now)), "unknown key"},
		{"not a JWT", "opaque", "not a JWT"},
	} {
		if _, err := k.Verify(tc.token, now); !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrUnauthenticated with %q", tc.name, err, tc.want)
		}
	}
}

func TestKeySetLoad(t *testing.T) {
	t.Parallel()
	var k KeySet
	for _, tc := range []struct{ cfg, jwks string }{
		{`{}`, `{"keys":[]}`},
		{`{"issuer":"x"}`, `{"keys":[]}`},
		{`{"issuer":"x"}`, `{"keys":[{"kty":"oct","kid":"a"}]}`},
		{`{"issuer":"x"}`, `{"keys":[{"kty":"EC","kid":"a","crv":"P-256","x":"AQ","y":"AQ"}]}`},
		{`{"issuer":"x"}`, `not json`},
	} {
		if err := k.Load([]byte(tc.cfg), []byte(tc.jwks)); err == nil {
			t.Errorf("Load(%s, %s): no error", tc.cfg, tc.jwks)
		}
	}
	if k.Loaded() {
		t.Error("loaded after only bad documents")
	}
	// One usable key among unusable ones loads.
	if err := k.Load([]byte(`{"issuer":"x"}`), []byte(`{"keys":[{"kty":"EC","kid":"p384","crv":"P-384","x":"AQ","y":"AQ"},{"kty":"RSA","kid":"r","n":"AQAB","e":"AQAB"}]}`)); err != nil || !k.Loaded() {
		t.Errorf("a JWKS with one usable key: %v", err)
	}
}

// TestAuthenticateVerifiesLocallyWhileTheAPIServerIsAway: a token never
// reviewed is verified against the keys when TokenReview cannot be asked,
// and reviewed once the API server is back (after downFor).
func TestAuthenticateVerifiesLocallyWhileTheAPIServerIsAway(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	k, rs, _ := testKeys(t)
	tok := rs.token(t, routerClaims(now))
	f := &fakeReviewer{users: map[string]authenticationv1.UserInfo{tok: routerUser("r1", "node1")}}
	f.down.Store(true)
	a := NewAuthenticator(f, 0)
	a.now = func() time.Time { return now }
	if _, err := a.Authenticate(t.Context(), tok); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("without keys: %v, want ErrUnavailable", err)
	}
	a.VerifyLocally(k)
	id, err := a.Authenticate(t.Context(), tok)
	if err != nil || id.Pod != "r1" || id.Node != "node1" {
		t.Fatalf("verified locally: %+v, %v", id, err)
	}
	if _, err := a.Authenticate(t.Context(), rs.token(t, with(routerClaims(now), "aud", []string{"api"}))); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("a token for another audience verified locally: %v", err)
	}
	reviews := f.reviews.Load()
	_, _ = a.Authenticate(t.Context(), tok)
	if f.reviews.Load() != reviews {
		t.Error("a locally verified token was not kept")
	}
	f.down.Store(false)
	now = now.Add(downFor)
	if _, err := a.Authenticate(t.Context(), tok); err != nil || f.reviews.Load() != reviews+1 {
		t.Errorf("after downFor with the API server back: %v, %d reviews (want one more)", err, f.reviews.Load()-reviews)
	}
}

func with(c map[string]any, k string, v any) map[string]any { c[k] = v; return c }
