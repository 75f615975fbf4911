package assign

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	jose "github.com/go-jose/go-jose/v4"
)

// Token formats. An instance lists those it verifies in the
// HeaderTokenFormats of its answers to GET Path; a controller signs an
// assign in the first listed it can sign (PickFormat).
const (
	// FormatJWS is a JWT: an RFC 7515 compact JWS, header {"alg":"EdDSA",
	// "typ":"JWT"} (RFC 8037), payload the JSON Claims. Any JOSE or JWT
	// library verifies it with the PEM public key in the ConfigMap
	// skipper-assign-key (docs/functions.md).
	FormatJWS = "jws"
	// FormatV1 is Skipper's own: "v1.<payload>.<signature>" (doc.go).
	// Every instance verifies it; an instance that lists no formats
	// predates the list and verifies only it.
	FormatV1 = "v1"
)

// Formats are the formats Verify accepts, preferred first: what an
// instance built on this package lists.
var Formats = []string{FormatJWS, FormatV1}

// HeaderTokenFormats is the header of an instance's answers to GET Path
// listing the token formats it verifies, comma-separated, preferred
// first.
const HeaderTokenFormats = "X-Skipper-Token-Formats"

// PickFormat returns the format to sign an assign in for an instance
// whose GET answer carried listed as HeaderTokenFormats: the first listed
// format this package signs, FormatV1 when none is (an instance that
// lists nothing is older than the list and verifies only FormatV1).
func PickFormat(listed string) string {
	for f := range strings.SplitSeq(listed, ",") {
		if f = strings.TrimSpace(f); slices.Contains(Formats, f) {
			return f
		}
	}
	return FormatV1
}

// signJWS returns claims as a FormatJWS token, signed with go-jose.
func signJWS(key ed25519.PrivateKey, c Claims) (string, error) {
	payload, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encode claims: %w", err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: key}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return "", fmt.Errorf("jws signer: %w", err)
	}
	obj, err := signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("sign jws: %w", err)
	}
	return obj.CompactSerialize()
}

// verifyJWS checks a FormatJWS token's signature against keys with
// go-jose, allowing only EdDSA and only the compact serialization in
// canonical unpadded base64url, and returns its payload. A header with fields beyond alg and typ, or a typ
// other than JWT, is refused: nothing here reads them, so none may ride
// along.
func verifyJWS(keys []ed25519.PublicKey, token string) ([]byte, error) {
	// One spelling per token, as for FormatV1: go-jose's decoding accepts
	// non-zero padding bits.
	segs := strings.Split(token, ".")
	if len(segs) != 3 {
		return nil, fmt.Errorf("%w: %d parts, want 3", ErrMalformed, len(segs))
	}
	for _, seg := range segs {
		if _, err := strictB64.DecodeString(seg); err != nil || seg == "" {
			return nil, fmt.Errorf("%w: part encoding", ErrMalformed)
		}
	}
	obj, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if len(obj.Signatures) != 1 {
		return nil, fmt.Errorf("%w: %d signatures", ErrMalformed, len(obj.Signatures))
	}
	if !plainHeader(token) {
		return nil, fmt.Errorf("%w: header: want exactly alg EdDSA and typ JWT", ErrMalformed)
	}
	for _, k := range keys {
		if payload, err := obj.Verify(k); err == nil {
			return payload, nil
		}
	}
	return nil, ErrSignature
}

// plainHeader reports whether the compact JWS token's protected header is
// exactly {"alg": "EdDSA", "typ": "JWT"}, in any order and spacing.
func plainHeader(token string) bool {
	seg, _, _ := strings.Cut(token, ".")
	raw, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return false
	}
	var h map[string]any
	if json.Unmarshal(raw, &h) != nil || len(h) != 2 {
		return false
	}
	return h["alg"] == "EdDSA" && h["typ"] == "JWT"
}
