package assign

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSignVerify(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	otherPub, _, _ := ed25519.GenerateKey(nil)
	now := time.Unix(1_800_000_000, 0)
	tok, err := Sign(FormatV1, priv, Claims{Audience: "uid-1", Function: "default/echo", IssuedAt: now.Unix(), Expiry: now.Add(time.Minute).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		keys     []ed25519.PublicKey
		token    string
		audience string
		now      time.Time
		want     error
	}{
		{name: "valid", keys: []ed25519.PublicKey{pub}, token: tok, audience: "uid-1", now: now},
		{name: "second of two keys", keys: []ed25519.PublicKey{otherPub, pub}, token: tok, audience: "uid-1", now: now},
		{name: "first of two keys", keys: []ed25519.PublicKey{pub, otherPub}, token: tok, audience: "uid-1", now: now},
		{name: "other pod", keys: []ed25519.PublicKey{pub}, token: tok, audience: "uid-2", now: now, want: ErrAudience},
		{name: "expired", keys: []ed25519.PublicKey{pub}, token: tok, audience: "uid-1", now: now.Add(time.Minute), want: ErrExpired},
		{name: "other key", keys: []ed25519.PublicKey{otherPub}, token: tok, audience: "uid-1", now: now, want: ErrSignature},
		{name: "no keys", keys: nil, token: tok, audience: "uid-1", now: now, want: ErrSignature},
		{name: "tampered", keys: []ed25519.PublicKey{pub}, token: strings.Replace(tok, "v1.e", "v1.f", 1), audience: "uid-1", now: now, want: ErrSignature},
		{name: "no prefix", keys: []ed25519.PublicKey{pub}, token: "x" + tok, audience: "uid-1", now: now, want: ErrMalformed},
		{name: "no signature", keys: []ed25519.PublicKey{pub}, token: "v1.abc", audience: "uid-1", now: now, want: ErrMalformed},
		{name: "empty", keys: []ed25519.PublicKey{pub}, token: "", audience: "uid-1", now: now, want: ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Verify(tt.keys, tt.token, tt.audience, tt.now)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Verify() error = %v, want %v", err, tt.want)
			}
			if tt.want == nil && c.Function != "default/echo" {
				t.Fatalf("claims function = %q", c.Function)
			}
		})
	}
}

func testRequest() Request {
	return Request{
		Function: "default/echo", Port: 8080, Oneshot: false, TimeoutSeconds: 2.5,
		Config: map[string]string{"a": "1", "b": "2", "<html>": "&"}, Claim: "c-1",
		Callers: &Callers{Namespaces: []string{"team-b", "team-a"}, ServiceAccounts: []string{"x/y", "a/b"}},
	}
}

// TestRequestDigest: equal requests digest alike however they are
// written (config order, callers order, absent or empty, the token, a
// JSON round trip); a change to any field changes the digest.
func TestRequestDigest(t *testing.T) {
	t.Parallel()
	base := RequestDigest(testRequest())
	tests := []struct {
		name   string
		change func(*Request)
		same   bool
	}{
		{name: "the token", change: func(r *Request) { r.Token = "v1.other" }, same: true},
		{name: "config written in another order", same: true, change: func(r *Request) {
			r.Config = map[string]string{}
			for _, k := range []string{"b", "<html>", "a"} {
				r.Config[k] = testRequest().Config[k]
			}
		}},
		{name: "callers in another order", same: true, change: func(r *Request) {
			r.Callers = &Callers{Namespaces: []string{"team-a", "team-b"}, ServiceAccounts: []string{"a/b", "x/y"}}
		}},
		{name: "a JSON round trip", same: true, change: func(r *Request) {
			b, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			*r = Request{}
			if err := json.Unmarshal(b, r); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "function", change: func(r *Request) { r.Function = "default/other" }},
		{name: "port", change: func(r *Request) { r.Port = 8081 }},
		{name: "oneshot", change: func(r *Request) { r.Oneshot = true }},
		{name: "timeout stretched", change: func(r *Request) { r.TimeoutSeconds = 3600 }},
		{name: "timeout dropped", change: func(r *Request) { r.TimeoutSeconds = 0 }},
		{name: "config value", change: func(r *Request) { r.Config["a"] = "2" }},
		{name: "config key added", change: func(r *Request) { r.Config["c"] = "" }},
		{name: "config key removed", change: func(r *Request) { delete(r.Config, "b") }},
		{name: "config dropped", change: func(r *Request) { r.Config = nil }},
		{name: "config value moved to another key", change: func(r *Request) { r.Config = map[string]string{"a": "12", "<html>": "&"} }},
		{name: "claim", change: func(r *Request) { r.Claim = "c-2" }},
		{name: "callers dropped", change: func(r *Request) { r.Callers = nil }},
		{name: "a namespace added", change: func(r *Request) { r.Callers.Namespaces = append(r.Callers.Namespaces, "team-c") }},
		{name: "a namespace made a ServiceAccount", change: func(r *Request) {
			r.Callers = &Callers{Namespaces: []string{"team-b"}, ServiceAccounts: []string{"x/y", "a/b", "team-a"}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testRequest()
			tt.change(&r)
			if got := RequestDigest(r) == base; got != tt.same {
				t.Errorf("digest unchanged = %v, want %v", got, tt.same)
			}
		})
	}
	// Absent and empty mean the same, so they digest the same.
	empty := RequestDigest(Request{Function: "f", Config: map[string]string{}, Callers: &Callers{Namespaces: []string{}}})
	if absent := RequestDigest(Request{Function: "f"}); absent != empty {
		t.Errorf("absent config and callers digest %s, empty ones %s", absent, empty)
	}
	// The caller's request is left as it was (the callers are sorted in a copy).
	r := testRequest()
	RequestDigest(r)
	if diff := cmp.Diff(testRequest(), r); diff != "" {
		t.Errorf("RequestDigest changed its argument (-want +got):\n%s", diff)
	}
}

func TestVerifyRequest(t *testing.T) {
	t.Parallel()
	pub, priv, _ := ed25519.GenerateKey(nil)
	nextPub, nextPriv, _ := ed25519.GenerateKey(nil)
	now := time.Unix(1_800_000_000, 0)
	sign := func(key ed25519.PrivateKey, r Request) Request {
		t.Helper()
		tok, err := SignRequest(FormatJWS, key, "uid-1", r, now, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		r.Token = tok
		return r
	}
	unbound := testRequest()
	unbound.Token, _ = Sign(FormatV1, priv, Claims{Audience: "uid-1", Function: unbound.Function, IssuedAt: now.Unix(), Expiry: now.Add(time.Minute).Unix()})
	both := []ed25519.PublicKey{pub, nextPub}
	tests := []struct {
		name   string
		keys   []ed25519.PublicKey
		req    func() Request
		now    time.Time
		want   error
		reason string
	}{
		{name: "valid", keys: []ed25519.PublicKey{pub}, req: func() Request { return sign(priv, testRequest()) }},
		{name: "old key of two", keys: both, req: func() Request { return sign(priv, testRequest()) }},
		{name: "new key of two", keys: both, req: func() Request { return sign(nextPriv, testRequest()) }},
		{name: "new key not published", keys: []ed25519.PublicKey{pub}, req: func() Request { return sign(nextPriv, testRequest()) }, want: ErrSignature, reason: ReasonBadToken},
		{name: "expired", keys: []ed25519.PublicKey{pub}, now: now.Add(time.Minute), req: func() Request { return sign(priv, testRequest()) }, want: ErrExpired, reason: ReasonExpired},
		{name: "config changed", keys: []ed25519.PublicKey{pub}, want: ErrMismatch, reason: ReasonBadToken, req: func() Request {
			r := sign(priv, testRequest())
			r.Config = map[string]string{"a": "evil"}
			return r
		}},
		{name: "timeout stretched", keys: []ed25519.PublicKey{pub}, want: ErrMismatch, reason: ReasonBadToken, req: func() Request {
			r := sign(priv, testRequest())
			r.TimeoutSeconds = 1e6
			return r
		}},
		{name: "callers dropped", keys: []ed25519.PublicKey{pub}, want: ErrMismatch, reason: ReasonBadToken, req: func() Request {
			r := sign(priv, testRequest())
			r.Callers = nil
			return r
		}},
		{name: "another function", keys: []ed25519.PublicKey{pub}, want: ErrMismatch, reason: ReasonBadToken, req: func() Request {
			r := sign(priv, testRequest())
			r.Function = "default/other"
			return r
		}},
		{name: "no id or digest", keys: []ed25519.PublicKey{pub}, want: ErrUnbound, reason: ReasonBadToken, req: func() Request { return unbound }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at := tt.now
			if at.IsZero() {
				at = now
			}
			r := tt.req()
			c, err := VerifyRequest(tt.keys, r, "uid-1", at)
			if !errors.Is(err, tt.want) {
				t.Fatalf("VerifyRequest() error = %v, want %v", err, tt.want)
			}
			if err != nil {
				if got := Reason(err); got != tt.reason {
					t.Errorf("Reason() = %q, want %q", got, tt.reason)
				}
				return
			}
			if len(c.ID) != 26 || c.Digest != RequestDigest(r) || c.Expiry != now.Add(time.Minute).Unix() {
				t.Errorf("claims %+v", c)
			}
		})
	}
	// Every token has its own id.
	a, b := sign(priv, testRequest()), sign(priv, testRequest())
	ca, _ := VerifyRequest([]ed25519.PublicKey{pub}, a, "uid-1", now)
	cb, _ := VerifyRequest([]ed25519.PublicKey{pub}, b, "uid-1", now)
	if ca.ID == cb.ID {
		t.Errorf("two tokens share id %s", ca.ID)
	}
}

// TestUsed: an id is accepted once until its token expires; the memory
// is bounded, forgets expired ids when full, and refuses rather than
// forget one that is not.
func TestUsed(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	claims := func(id string, life time.Duration) Claims {
		return Claims{ID: id, Expiry: now.Add(life).Unix()}
	}
	u := NewUsed(3)
	steps := []struct {
		name string
		c    Claims
		at   time.Time
		want error
		len  int
	}{
		{name: "first", c: claims("a", time.Minute), at: now, len: 1},
		{name: "replayed", c: claims("a", time.Minute), at: now.Add(59 * time.Second), want: ErrReplayed, len: 1},
		{name: "second", c: claims("b", 2*time.Minute), at: now, len: 2},
		{name: "third", c: claims("c", 2*time.Minute), at: now, len: 3},
		{name: "full", c: claims("d", time.Minute), at: now.Add(30 * time.Second), want: ErrTooMany, len: 3},
		{name: "full, one expired: pruned", c: claims("d", 2*time.Minute), at: now.Add(time.Minute), len: 3},
		{name: "a's id again, its token expired", c: claims("a", 3*time.Minute), at: now.Add(time.Minute), want: ErrTooMany, len: 3},
		{name: "everything expired", c: claims("e", 3*time.Minute), at: now.Add(2 * time.Minute), len: 1},
	}
	for _, s := range steps {
		err := u.Use(s.c, s.at)
		if !errors.Is(err, s.want) {
			t.Fatalf("%s: Use() = %v, want %v", s.name, err, s.want)
		}
		if u.Len() != s.len {
			t.Fatalf("%s: Len() = %d, want %d", s.name, u.Len(), s.len)
		}
	}
	if got := Reason(u.Use(claims("e", time.Minute), now.Add(2*time.Minute))); got != ReasonReplayed {
		t.Errorf("Reason = %q, want %q", got, ReasonReplayed)
	}
}

func TestKeyPEMRoundTrip(t *testing.T) {
	t.Parallel()
	pub, priv, _ := ed25519.GenerateKey(nil)
	next, _, _ := ed25519.GenerateKey(nil)
	pubPEM, err := MarshalPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	nextPEM, _ := MarshalPublicKey(next)
	privPEM, err := MarshalPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	gotPriv, err := ParsePrivateKey(privPEM)
	if err != nil || !gotPriv.Equal(priv) {
		t.Fatalf("private key round trip: %v", err)
	}
	tests := []struct {
		name    string
		data    string
		want    []ed25519.PublicKey
		wantErr string
	}{
		{name: "one", data: string(pubPEM), want: []ed25519.PublicKey{pub}},
		{name: "two", data: string(pubPEM) + string(nextPEM), want: []ed25519.PublicKey{pub, next}},
		{name: "two, text around", data: "# rotating\n" + string(pubPEM) + "\n" + string(nextPEM) + "\n", want: []ed25519.PublicKey{pub, next}},
		{name: "none", data: "", wantErr: "no PUBLIC KEY"},
		{name: "a private key", data: string(privPEM), wantErr: "PEM block 1 is \"PRIVATE KEY\""},
		{name: "a private key second", data: string(pubPEM) + string(privPEM), wantErr: "PEM block 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePublicKeys([]byte(tt.data))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParsePublicKeys() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRequestDigestCoversEveryField: a field added to Request changes the
// digest (or the token would not bind it), Token alone excepted.
func TestRequestDigestCoversEveryField(t *testing.T) {
	t.Parallel()
	zero := RequestDigest(Request{})
	typ := reflect.TypeFor[Request]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		t.Run(f.Name, func(t *testing.T) {
			var r Request
			v := reflect.ValueOf(&r).Elem().Field(i)
			switch f.Type.Kind() {
			case reflect.String:
				v.SetString("x")
			case reflect.Int32:
				v.SetInt(1)
			case reflect.Bool:
				v.SetBool(true)
			case reflect.Float64:
				v.SetFloat(1)
			case reflect.Map:
				v.Set(reflect.ValueOf(map[string]string{"k": "v"}))
			case reflect.Pointer:
				v.Set(reflect.ValueOf(&Callers{Namespaces: []string{"n"}}))
			default:
				t.Fatalf("field %s of kind %s: teach this test to set it", f.Name, f.Type.Kind())
			}
			if changed := RequestDigest(r) != zero; changed != (f.Name != "Token") {
				t.Errorf("setting %s changes the digest: %v", f.Name, changed)
			}
		})
	}
}
