package assign

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Path is where an instance accepts its assignment.
const Path = "/__skipper/assign"

const tokenPrefix = "v1."

// strictB64 decodes a token's parts: unpadded base64url, canonical only.
var strictB64 = base64.RawURLEncoding.Strict()

// Sentinel errors Verify wraps; callers answer 401/403 on any of them.
var (
	ErrMalformed = errors.New("malformed token")
	ErrSignature = errors.New("bad token signature")
	ErrAudience  = errors.New("token audience is not this instance")
	ErrExpired   = errors.New("token expired")
)

// Claims are what a token asserts.
type Claims struct {
	// Audience is the UID of the pod the assignment is for.
	Audience string `json:"aud"`
	// Function is "namespace/name".
	Function string `json:"fn"`
	// IssuedAt and Expiry are Unix seconds.
	IssuedAt int64 `json:"iat"`
	Expiry   int64 `json:"exp"`
}

// Request is the JSON body of POST Path.
type Request struct {
	Token string `json:"token"`
	// Function is "namespace/name".
	Function string `json:"function"`
	// Port the instance should serve the function on (informational: the
	// instance already serves on its pod port).
	Port int32 `json:"port,omitempty"`
	// Oneshot instances serve a single request.
	Oneshot bool `json:"oneshot,omitempty"`
	// TimeoutSeconds is the per-request timeout, 0 when unset.
	TimeoutSeconds float64 `json:"timeoutSeconds,omitempty"`
	// Config is the Function's spec.config.
	Config map[string]string `json:"config,omitempty"`
	// Claim identifies the claim sending it (random). An instance accepts a
	// repeat assign for the function it holds (a controller that lost the
	// answer retries), but for a oneshot function only from the same
	// claim: a oneshot instance belongs to one call, and two claims of it
	// must not both win.
	Claim string `json:"claim,omitempty"`
	// Callers are the Function's spec.callers (nil: any caller). An
	// instance that checks them refuses a request whose X-Skipper-Caller
	// (set by the router: "<namespace>/<serviceaccount>") they do not
	// list. A repeat assign hands over the callers as they are now.
	Callers *Callers `json:"callers,omitempty"`
}

// Callers are the namespaces and ServiceAccounts ("<namespace>/<name>")
// allowed to call a function.
type Callers struct {
	Namespaces      []string `json:"namespaces,omitempty"`
	ServiceAccounts []string `json:"serviceAccounts,omitempty"`
}

// HeaderCaller is the header a router tells an instance who calls with:
// "<namespace>/<serviceaccount>" of the calling pod.
const HeaderCaller = "X-Skipper-Caller"

// Allows reports whether the caller a router named in X-Skipper-Caller
// (account, "<namespace>/<serviceaccount>") may call. A nil c allows any
// caller, and the empty account (no header) only then.
func (c *Callers) Allows(account string) bool {
	if c == nil || len(c.Namespaces) == 0 && len(c.ServiceAccounts) == 0 {
		return true
	}
	ns, sa, ok := strings.Cut(account, "/")
	if !ok || ns == "" || sa == "" {
		return false
	}
	return slices.Contains(c.Namespaces, ns) || slices.Contains(c.ServiceAccounts, account)
}

// Assignment is the JSON body of GET on Path: the function the instance
// holds. An instance that holds none answers 404 (reason unassigned), and
// one asked with ?pod=<uid> that is not that pod 404 (reason other_pod).
// Controllers ask it of a pool pod routers report as an instance, whose
// record may never have landed.
type Assignment struct {
	Function string `json:"function"`
}

// Reasons of GET's 404.
const (
	ReasonUnassigned = "unassigned"
	ReasonOtherPod   = "other_pod"
)

// ReasonAlreadyAssigned is the reason of a 409 answer to an assign: the
// instance accepted another function before (an instance accepts exactly
// one for its life; a repeat for the same function is accepted).
const ReasonAlreadyAssigned = "already_assigned"

// Conflict is the JSON body of that 409: it names the function the
// instance holds, so that a controller that lost a race, or finds an
// instance assigned but not recorded, knows whose it is.
type Conflict struct {
	Error  string `json:"error"`
	Reason string `json:"reason"`
	// Function the instance holds, "namespace/name".
	Function string `json:"function"`
}

// Sign returns a token for claims.
func Sign(key ed25519.PrivateKey, c Claims) (string, error) {
	payload, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encode claims: %w", err)
	}
	signed := tokenPrefix + base64.RawURLEncoding.EncodeToString(payload)
	sig := ed25519.Sign(key, []byte(signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

// Verify checks token against key for the pod with UID audience at now and
// returns its claims.
func Verify(key ed25519.PublicKey, token, audience string, now time.Time) (Claims, error) {
	var c Claims
	if !strings.HasPrefix(token, tokenPrefix) {
		return c, fmt.Errorf("%w: missing %q prefix", ErrMalformed, tokenPrefix)
	}
	dot := strings.LastIndexByte(token, '.')
	if dot < len(tokenPrefix) {
		return c, fmt.Errorf("%w: no signature", ErrMalformed)
	}
	signed, sigPart := token[:dot], token[dot+1:]
	// Strict: a token has one spelling. Lenient decoding accepts non-zero
	// padding bits, so one signed token would verify under several strings.
	sig, err := strictB64.DecodeString(sigPart)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return c, fmt.Errorf("%w: signature encoding", ErrMalformed)
	}
	if !ed25519.Verify(key, []byte(signed), sig) {
		return c, ErrSignature
	}
	payload, err := strictB64.DecodeString(signed[len(tokenPrefix):])
	if err != nil {
		return c, fmt.Errorf("%w: payload encoding", ErrMalformed)
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return c, fmt.Errorf("%w: payload: %v", ErrMalformed, err)
	}
	if c.Audience != audience {
		return c, fmt.Errorf("%w: got %q, want %q", ErrAudience, c.Audience, audience)
	}
	if now.Unix() >= c.Expiry {
		return c, fmt.Errorf("%w at %s", ErrExpired, time.Unix(c.Expiry, 0).UTC().Format(time.RFC3339))
	}
	return c, nil
}

// MarshalPublicKey encodes key as a PKIX "PUBLIC KEY" PEM block.
func MarshalPublicKey(key ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// ParsePublicKey decodes a PEM block written by MarshalPublicKey.
func ParsePublicKey(data []byte) (ed25519.PublicKey, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, errors.New("parse public key: no PUBLIC KEY PEM block")
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse public key: %w", err)
	}
	pk, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("parse public key: %T is not ed25519", k)
	}
	return pk, nil
}

// MarshalPrivateKey encodes key as a PKCS#8 "PRIVATE KEY" PEM block.
func MarshalPrivateKey(key ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParsePrivateKey decodes a PEM block written by MarshalPrivateKey.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("parse private key: no PRIVATE KEY PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse private key: %w", err)
	}
	pk, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("parse private key: %T is not ed25519", k)
	}
	return pk, nil
}
