package assign

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
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

// Sentinel errors Verify, VerifyRequest and Used.Use wrap; Reason maps
// them to the reason of the instance's answer.
var (
	ErrMalformed = errors.New("malformed token")
	ErrSignature = errors.New("bad token signature")
	ErrAudience  = errors.New("token audience is not this instance")
	ErrExpired   = errors.New("token expired")
	// ErrUnbound: the token carries no id or no request digest (signed by
	// a controller older than the instance).
	ErrUnbound = errors.New("token binds no request")
	// ErrMismatch: the body is not the request the token was signed for.
	ErrMismatch = errors.New("request does not match its token")
	// ErrReplayed: the instance accepted a token with this id before.
	ErrReplayed = errors.New("token already used")
	// ErrTooMany: the instance holds as many unexpired ids as it may.
	ErrTooMany = errors.New("too many assign tokens in flight")
)

// Reasons of an instance's refusal of an assign (the "reason" of its JSON
// error body).
const (
	ReasonBadToken = "bad_token" // 401
	ReasonExpired  = "expired"   // 401
	ReasonReplayed = "replayed"  // 401
	ReasonTooMany  = "too_many_assigns"
)

// Reason is the reason an instance answers for err, one of Verify's,
// VerifyRequest's or Used.Use's errors. Every one is answered 401 but
// ErrTooMany, answered 503 (it says nothing about the token).
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrExpired):
		return ReasonExpired
	case errors.Is(err, ErrReplayed):
		return ReasonReplayed
	case errors.Is(err, ErrTooMany):
		return ReasonTooMany
	}
	return ReasonBadToken
}

// Claims are what a token asserts.
type Claims struct {
	// Audience is the UID of the pod the assignment is for.
	Audience string `json:"aud"`
	// Function is "namespace/name".
	Function string `json:"fn"`
	// IssuedAt and Expiry are Unix seconds.
	IssuedAt int64 `json:"iat"`
	Expiry   int64 `json:"exp"`
	// ID is random and unique to this token (NewID); an instance accepts
	// it once (Used).
	ID string `json:"jti,omitempty"`
	// Digest is RequestDigest of the request the token was signed for.
	// Older instances ignore ID and Digest (unknown JSON fields), so a
	// token that carries them still assigns them.
	Digest string `json:"req,omitempty"`
}

// Request is the JSON body of POST Path.
type Request struct {
	// Token is SignRequest's token for the other fields: a field added
	// here must be added to canonicalRequest too, or a token would not
	// bind it.
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

// IsOtherPod reports whether body, of a 404 answer to GET on Path, says
// the instance is another pod (ReasonOtherPod: the asked IP was reused).
func IsOtherPod(body []byte) bool {
	var e struct {
		Reason string `json:"reason"`
	}
	return json.Unmarshal(body, &e) == nil && e.Reason == ReasonOtherPod
}

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

// NewID returns a random token id: 26 base32 characters, 130 bits.
func NewID() string { return rand.Text() }

// digestDomain separates the digest's input from any other SHA-256 input.
const digestDomain = "skipper.dev/assign-request/v1\n"

// canonicalRequest is the digest's input: every field of Request but the
// token, always present, config keys sorted (encoding/json sorts map
// keys) and callers sorted, so that equal requests digest the same
// however they were written, and no field is left out.
type canonicalRequest struct {
	Function       string            `json:"function"`
	Port           int32             `json:"port"`
	Oneshot        bool              `json:"oneshot"`
	TimeoutSeconds float64           `json:"timeoutSeconds"`
	Config         map[string]string `json:"config"`
	Claim          string            `json:"claim"`
	Callers        Callers           `json:"callers"`
}

// RequestDigest is the digest a token binds r with: SHA-256, unpadded
// base64url, of digestDomain followed by r's fields other than Token as
// compact JSON (no HTML escaping) in canonicalRequest's order, config
// keys and both callers lists sorted, absent and empty alike (a nil
// config is {}, nil callers are empty lists: they mean the same).
func RequestDigest(r Request) string {
	c := canonicalRequest{
		Function: r.Function, Port: r.Port, Oneshot: r.Oneshot, TimeoutSeconds: r.TimeoutSeconds,
		Config: r.Config, Claim: r.Claim,
		Callers: Callers{Namespaces: []string{}, ServiceAccounts: []string{}},
	}
	if c.Config == nil {
		c.Config = map[string]string{}
	}
	if r.Callers != nil {
		c.Callers.Namespaces = append(c.Callers.Namespaces, r.Callers.Namespaces...)
		c.Callers.ServiceAccounts = append(c.Callers.ServiceAccounts, r.Callers.ServiceAccounts...)
		slices.Sort(c.Callers.Namespaces)
		slices.Sort(c.Callers.ServiceAccounts)
	}
	var b bytes.Buffer
	b.WriteString(digestDomain)
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	// Encode fails only on unsupported values: a NaN or infinite timeout,
	// which no Function has. Its digest is then the domain alone, which
	// no valid request has.
	_ = enc.Encode(c)
	sum := sha256.Sum256(b.Bytes())
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// SignRequest returns a token in format (FormatJWS or FormatV1) for r to
// the pod with UID audience, valid for lifetime from now: a fresh id and
// r's digest.
func SignRequest(format string, key ed25519.PrivateKey, audience string, r Request, now time.Time, lifetime time.Duration) (string, error) {
	return Sign(format, key, Claims{
		Audience: audience,
		Function: r.Function,
		IssuedAt: now.Unix(),
		Expiry:   now.Add(lifetime).Unix(),
		ID:       NewID(),
		Digest:   RequestDigest(r),
	})
}

// VerifyRequest checks r.Token as Verify does, and that the token was
// signed for r itself: its function, an id, and r's digest. It does not
// check the id is new (Used does).
func VerifyRequest(keys []ed25519.PublicKey, r Request, audience string, now time.Time) (Claims, error) {
	c, err := Verify(keys, r.Token, audience, now)
	if err != nil {
		return c, err
	}
	if c.Function != r.Function {
		return c, fmt.Errorf("%w: token is for function %q, body names %q", ErrMismatch, c.Function, r.Function)
	}
	if c.ID == "" || c.Digest == "" {
		return c, fmt.Errorf("%w: it has no id or request digest (signed by an older controller?)", ErrUnbound)
	}
	if c.Digest != RequestDigest(r) {
		return c, ErrMismatch
	}
	return c, nil
}

// Sign returns a token for claims in format (FormatJWS or FormatV1).
func Sign(format string, key ed25519.PrivateKey, c Claims) (string, error) {
	switch format {
	case FormatJWS:
		return signJWS(key, c)
	case FormatV1:
		return signV1(key, c)
	}
	return "", fmt.Errorf("sign: unknown token format %q", format)
}

// signV1 returns claims as a FormatV1 token.
func signV1(key ed25519.PrivateKey, c Claims) (string, error) {
	payload, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encode claims: %w", err)
	}
	signed := tokenPrefix + base64.RawURLEncoding.EncodeToString(payload)
	sig := ed25519.Sign(key, []byte(signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

// Verify checks that token, in any of Formats, is signed by one of keys
// (key rotation publishes two), for the pod with UID audience, unexpired
// at now, and returns its claims.
func Verify(keys []ed25519.PublicKey, token, audience string, now time.Time) (Claims, error) {
	var c Claims
	var payload []byte
	var err error
	if !canonicalChars(token) {
		return c, fmt.Errorf("%w: a character outside unpadded base64url and dots", ErrMalformed)
	}
	if strings.HasPrefix(token, tokenPrefix) {
		payload, err = verifyV1(keys, token)
	} else {
		payload, err = verifyJWS(keys, token)
	}
	if err != nil {
		return c, err
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

// canonicalChars reports whether token holds only unpadded base64url's
// alphabet and dots. Base64 decoders skip CR and LF even when strict, so
// without this a token would verify under other spellings.
func canonicalChars(token string) bool {
	for i := 0; i < len(token); i++ {
		switch b := token[i]; {
		case 'A' <= b && b <= 'Z', 'a' <= b && b <= 'z', '0' <= b && b <= '9', b == '-', b == '_', b == '.':
		default:
			return false
		}
	}
	return true
}

// verifyV1 checks a FormatV1 token's signature against keys and returns
// its payload.
func verifyV1(keys []ed25519.PublicKey, token string) ([]byte, error) {
	dot := strings.LastIndexByte(token, '.')
	if dot < len(tokenPrefix) {
		return nil, fmt.Errorf("%w: no signature", ErrMalformed)
	}
	signed, sigPart := token[:dot], token[dot+1:]
	// Strict: a token has one spelling. Lenient decoding accepts non-zero
	// padding bits, so one signed token would verify under several strings.
	sig, err := strictB64.DecodeString(sigPart)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, fmt.Errorf("%w: signature encoding", ErrMalformed)
	}
	if !slices.ContainsFunc(keys, func(k ed25519.PublicKey) bool { return ed25519.Verify(k, []byte(signed), sig) }) {
		return nil, ErrSignature
	}
	payload, err := strictB64.DecodeString(signed[len(tokenPrefix):])
	if err != nil {
		return nil, fmt.Errorf("%w: payload encoding", ErrMalformed)
	}
	return payload, nil
}

// MarshalPublicKey encodes key as a PKIX "PUBLIC KEY" PEM block.
func MarshalPublicKey(key ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// ParsePublicKeys decodes the PEM blocks written by MarshalPublicKey,
// concatenated: the keys an instance accepts (two while a key rotates).
// Every block must be an ed25519 PUBLIC KEY, and there must be one.
func ParsePublicKeys(data []byte) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	for n := 1; ; n++ {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("parse public key: PEM block %d is %q, not PUBLIC KEY", n, block.Type)
		}
		k, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse public key: PEM block %d: %w", n, err)
		}
		pk, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("parse public key: PEM block %d: %T is not ed25519", n, k)
		}
		keys = append(keys, pk)
	}
	if len(keys) == 0 {
		return nil, errors.New("parse public key: no PUBLIC KEY PEM block")
	}
	return keys, nil
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
