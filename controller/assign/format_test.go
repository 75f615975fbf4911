package assign

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// jwsWith returns a compact JWS of payload under the raw protected header
// header, signed with sign over the JWS signing input.
func jwsWith(header string, payload []byte, sign func([]byte) []byte) string {
	in := base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + base64.RawURLEncoding.EncodeToString(payload)
	return in + "." + base64.RawURLEncoding.EncodeToString(sign([]byte(in)))
}

func TestSignVerifyJWS(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	otherPub, _, _ := ed25519.GenerateKey(nil)
	now := time.Unix(1_800_000_000, 0)
	claims := Claims{Audience: "uid-1", Function: "default/echo", IssuedAt: now.Unix(), Expiry: now.Add(time.Minute).Unix()}
	tok, err := Sign(FormatJWS, priv, claims)
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"aud":"uid-1","fn":"default/echo","iat":1800000000,"exp":1800000060}`)
	edSign := func(in []byte) []byte { return ed25519.Sign(priv, in) }
	parts := strings.Split(tok, ".")
	// A forged token with the payload changed and the signature kept.
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(payload), "echo", "evil", 1))) + "." + parts[2]
	// HS256 (the algorithm confusion attack, a MAC keyed with the public
	// key's bytes): refused for its alg, whatever the MAC.
	hs := jwsWith(`{"alg":"HS256","typ":"JWT"}`, payload, func([]byte) []byte { return make([]byte, 32) })
	tests := []struct {
		name  string
		keys  []ed25519.PublicKey
		token string
		want  error
	}{
		{name: "valid", keys: []ed25519.PublicKey{pub}, token: tok},
		{name: "second of two keys", keys: []ed25519.PublicKey{otherPub, pub}, token: tok},
		{name: "hand-made, fields in another order", keys: []ed25519.PublicKey{pub}, token: jwsWith(`{"typ":"JWT", "alg":"EdDSA"}`, payload, edSign)},
		{name: "other key", keys: []ed25519.PublicKey{otherPub}, token: tok, want: ErrSignature},
		{name: "tampered payload", keys: []ed25519.PublicKey{pub}, token: tampered, want: ErrSignature},
		{name: "alg none", keys: []ed25519.PublicKey{pub}, token: jwsWith(`{"alg":"none","typ":"JWT"}`, payload, func([]byte) []byte { return nil }), want: ErrMalformed},
		{name: "alg HS256", keys: []ed25519.PublicKey{pub}, token: hs, want: ErrMalformed},
		{name: "a kid beside", keys: []ed25519.PublicKey{pub}, token: jwsWith(`{"alg":"EdDSA","typ":"JWT","kid":"k"}`, payload, edSign), want: ErrMalformed},
		{name: "crit", keys: []ed25519.PublicKey{pub}, token: jwsWith(`{"alg":"EdDSA","typ":"JWT","crit":["b64"],"b64":false}`, payload, edSign), want: ErrMalformed},
		{name: "no typ", keys: []ed25519.PublicKey{pub}, token: jwsWith(`{"alg":"EdDSA"}`, payload, edSign), want: ErrMalformed},
		{name: "JSON serialization", keys: []ed25519.PublicKey{pub}, token: `{"payload":"` + parts[1] + `","protected":"` + parts[0] + `","signature":"` + parts[2] + `"}`, want: ErrMalformed},
		{name: "two parts", keys: []ed25519.PublicKey{pub}, token: parts[0] + "." + parts[1], want: ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Verify(tt.keys, tt.token, "uid-1", now)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Verify() error = %v, want %v", err, tt.want)
			}
			if tt.want == nil && c != claims {
				t.Fatalf("claims %+v, want %+v", c, claims)
			}
		})
	}
	if _, err := Verify([]ed25519.PublicKey{pub}, tok, "uid-2", now); !errors.Is(err, ErrAudience) {
		t.Errorf("other pod: %v, want ErrAudience", err)
	}
	if _, err := Verify([]ed25519.PublicKey{pub}, tok, "uid-1", now.Add(time.Minute)); !errors.Is(err, ErrExpired) {
		t.Errorf("at expiry: %v, want ErrExpired", err)
	}
}

// TestJWSIsAStandardJWT: a stock JWT library (go-jose's jwt, as a runtime
// in another language would use its own) verifies an assign token with the
// public key alone and reads its standard and Skipper claims.
func TestJWSIsAStandardJWT(t *testing.T) {
	t.Parallel()
	pub, priv, _ := ed25519.GenerateKey(nil)
	now := time.Now()
	r := testRequest()
	tok, err := SignRequest(FormatJWS, priv, "uid-1", r, now, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		t.Fatal(err)
	}
	var std jwt.Claims
	var own struct {
		Function string `json:"fn"`
		Digest   string `json:"req"`
	}
	if err := parsed.Claims(pub, &std, &own); err != nil {
		t.Fatal(err)
	}
	if err := std.Validate(jwt.Expected{AnyAudience: jwt.Audience{"uid-1"}, Time: now}); err != nil {
		t.Errorf("standard claims: %v", err)
	}
	if std.ID == "" || own.Function != r.Function || own.Digest != RequestDigest(r) {
		t.Errorf("claims: id %q, fn %q, req %q; want an id, %q, %q", std.ID, own.Function, own.Digest, r.Function, RequestDigest(r))
	}
	if err := std.Validate(jwt.Expected{AnyAudience: jwt.Audience{"uid-1"}, Time: now.Add(2 * time.Minute)}); err == nil {
		t.Error("the library finds the token valid past its expiry")
	}
}

func TestPickFormat(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, listed, want string
	}{
		{"an instance older than the list", "", FormatV1},
		{"today's instance", "jws, v1", FormatJWS},
		{"the instance's order", "v1,jws", FormatV1},
		{"one this controller cannot sign passed over", "paseto-v4, jws", FormatJWS},
		{"none this controller can sign", "paseto-v4", FormatV1},
		{"spaces", " jws ", FormatJWS},
		{"names are exact", "JWS", FormatV1},
		{"v1 alone", "v1", FormatV1},
		{"empty items", ",,jws", FormatJWS},
		{"no parameters", "jws;q=1, v1;q=0", FormatV1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := PickFormat(tt.listed); got != tt.want {
				t.Errorf("PickFormat(%q) = %q, want %q", tt.listed, got, tt.want)
			}
		})
	}
}

func TestSignUnknownFormat(t *testing.T) {
	t.Parallel()
	_, priv, _ := ed25519.GenerateKey(nil)
	if _, err := Sign("paseto-v4", priv, Claims{}); err == nil {
		t.Error("Sign in an unknown format succeeded")
	}
}
