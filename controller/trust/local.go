package trust

import (
	"context"
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// KeySet verifies ServiceAccount tokens locally, against the API server's
// issuer and signing keys (its service-account issuer discovery:
// /.well-known/openid-configuration and /openid/v1/jwks, readable by every
// ServiceAccount by default), fetched while the API server is up. The
// Authenticator falls back to it when a token was never reviewed and the
// API server cannot review it: signature, issuer, audience and expiry are
// checked, but not whether the token's pod still exists (the API server's
// review would): the API server reviews it as soon as it can be asked.
type KeySet struct {
	mu     sync.RWMutex
	issuer string
	keys   map[string]crypto.PublicKey // by kid
}

// jwk is one key of a JWKS.
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// Fetch reads the issuer and keys through rc (the API server's REST
// client, e.g. Discovery().RESTClient()).
func (k *KeySet) Fetch(ctx context.Context, rc rest.Interface) error {
	cfg, err := rc.Get().AbsPath("/.well-known/openid-configuration").Do(ctx).Raw()
	if err != nil {
		return fmt.Errorf("openid configuration: %w", err)
	}
	jwks, err := rc.Get().AbsPath("/openid/v1/jwks").SetHeader("Accept", "application/jwk-set+json, application/json").Do(ctx).Raw()
	if err != nil {
		return fmt.Errorf("jwks: %w", err)
	}
	return k.Load(cfg, jwks)
}

// Load installs the issuer of an openid-configuration document and the keys
// of a JWKS document, replacing those held.
func (k *KeySet) Load(openidConfig, jwks []byte) error {
	var c struct {
		Issuer string `json:"issuer"`
	}
	if err := json.Unmarshal(openidConfig, &c); err != nil || c.Issuer == "" {
		return fmt.Errorf("openid configuration without an issuer (%v)", err)
	}
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(jwks, &set); err != nil {
		return fmt.Errorf("jwks: %w", err)
	}
	keys := map[string]crypto.PublicKey{}
	var skipped []error
	for _, j := range set.Keys {
		pk, err := j.publicKey()
		if err != nil {
			skipped = append(skipped, fmt.Errorf("jwks key %q: %w", j.Kid, err))
			continue // a key of a kind not verified here: the others still are
		}
		keys[j.Kid] = pk
	}
	if len(keys) == 0 {
		return errors.Join(append([]error{errors.New("jwks has no usable keys")}, skipped...)...)
	}
	k.mu.Lock()
	k.issuer, k.keys = c.Issuer, keys
	k.mu.Unlock()
	return nil
}

func (j jwk) publicKey() (crypto.PublicKey, error) {
	b := func(s string) (*big.Int, error) {
		v, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil || len(v) == 0 {
			return nil, fmt.Errorf("bad base64url %q", s)
		}
		return new(big.Int).SetBytes(v), nil
	}
	switch j.Kty {
	case "RSA":
		n, err := b(j.N)
		if err != nil {
			return nil, err
		}
		e, err := b(j.E)
		if err != nil || !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31 {
			return nil, fmt.Errorf("bad RSA exponent")
		}
		return &rsa.PublicKey{N: n, E: int(e.Int64())}, nil
	case "EC":
		if j.Crv != "P-256" {
			return nil, fmt.Errorf("curve %q not supported", j.Crv)
		}
		x, err := b(j.X)
		if err != nil {
			return nil, err
		}
		y, err := b(j.Y)
		if err != nil {
			return nil, err
		}
		if x.BitLen() > 256 || y.BitLen() > 256 {
			return nil, errors.New("point not on P-256")
		}
		pt := make([]byte, 65)
		pt[0] = 4
		x.FillBytes(pt[1:33])
		y.FillBytes(pt[33:])
		if _, err := ecdh.P256().NewPublicKey(pt); err != nil {
			return nil, fmt.Errorf("point not on P-256: %w", err)
		}
		return &ecdsa.PublicKey{Curve: elliptic.P256(), X: x, Y: y}, nil
	}
	return nil, fmt.Errorf("key type %q not supported", j.Kty)
}

// Run fetches the keys through rc now, again every 10 s until that
// succeeds, then every refresh (the API server rotates its keys rarely);
// failures go to onErr. It returns when ctx ends.
func (k *KeySet) Run(ctx context.Context, rc rest.Interface, refresh time.Duration, onErr func(error)) {
	for {
		wait := refresh
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := k.Fetch(fctx, rc)
		cancel()
		if err != nil {
			onErr(err)
			if !k.Loaded() {
				wait = 10 * time.Second
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// Loaded reports whether keys have been fetched.
func (k *KeySet) Loaded() bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return len(k.keys) > 0
}

// saClaims are the claims of a ServiceAccount token that matter here.
type saClaims struct {
	Iss string          `json:"iss"`
	Sub string          `json:"sub"`
	Aud json.RawMessage `json:"aud"`
	Exp int64           `json:"exp"`
	Nbf int64           `json:"nbf"`
	K8s struct {
		Namespace      string `json:"namespace"`
		ServiceAccount struct {
			Name string `json:"name"`
		} `json:"serviceaccount"`
		Pod *struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"pod"`
		Node *struct {
			Name string `json:"name"`
		} `json:"node"`
	} `json:"kubernetes.io"`
}

// Verify checks token's signature, issuer, audience (Audience) and
// validity at now, and returns its identity. Errors wrap
// ErrUnauthenticated.
func (k *KeySet) Verify(token string, now time.Time) (Identity, error) {
	fail := func(format string, a ...any) (Identity, error) {
		return Identity{}, fmt.Errorf("%w: verified locally: %s", ErrUnauthenticated, fmt.Sprintf(format, a...))
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return fail("not a JWT")
	}
	var hdr struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
	}
	hb, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil || json.Unmarshal(hb, &hdr) != nil {
		return fail("bad header")
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return fail("bad signature encoding")
	}
	k.mu.RLock()
	issuer, key := k.issuer, k.keys[hdr.Kid]
	k.mu.RUnlock()
	if key == nil {
		return fail("unknown key %q", hdr.Kid)
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	switch pk := key.(type) {
	case *rsa.PublicKey:
		if hdr.Alg != "RS256" || rsa.VerifyPKCS1v15(pk, crypto.SHA256, sum[:], sig) != nil {
			return fail("bad signature")
		}
	case *ecdsa.PublicKey:
		if hdr.Alg != "ES256" || len(sig) != 64 ||
			!ecdsa.Verify(pk, sum[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
			return fail("bad signature")
		}
	default:
		return fail("unusable key")
	}
	pb, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return fail("bad payload")
	}
	var c saClaims
	if err := json.Unmarshal(pb, &c); err != nil {
		return fail("bad claims: %v", err)
	}
	var aud []string
	if json.Unmarshal(c.Aud, &aud) != nil {
		var one string
		if json.Unmarshal(c.Aud, &one) == nil {
			aud = []string{one}
		}
	}
	switch {
	case c.Iss != issuer:
		return fail("issuer %q, want %q", c.Iss, issuer)
	case !slices.Contains(aud, Audience):
		return fail("audience %v, want %q", aud, Audience)
	case c.Exp == 0 || !now.Before(time.Unix(c.Exp, 0)):
		return fail("expired")
	case c.Nbf != 0 && now.Before(time.Unix(c.Nbf, 0)):
		return fail("not valid yet")
	case c.K8s.Namespace == "" || c.K8s.ServiceAccount.Name == "" ||
		c.Sub != "system:serviceaccount:"+c.K8s.Namespace+":"+c.K8s.ServiceAccount.Name:
		return fail("not a ServiceAccount token")
	}
	id := Identity{
		User:      c.Sub,
		Groups:    []string{"system:serviceaccounts", "system:serviceaccounts:" + c.K8s.Namespace, "system:authenticated"},
		Namespace: c.K8s.Namespace, ServiceAccount: c.K8s.ServiceAccount.Name,
		Expires: time.Unix(c.Exp, 0),
	}
	if c.K8s.Pod != nil {
		id.Pod, id.PodUID = c.K8s.Pod.Name, c.K8s.Pod.UID
	}
	if c.K8s.Node != nil {
		id.Node = c.K8s.Node.Name
	}
	return id, nil
}
