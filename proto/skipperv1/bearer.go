package skipperv1

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// The controllers' authentication (controller.proto, "Authentication"):
// the audience callers' tokens are minted for, and the metadata keys.
const (
	// Audience is the audience of routers' and replicas' tokens.
	Audience = "skipper"
	// HeaderAuthorization carries the caller's own token, "Bearer <token>".
	HeaderAuthorization = "authorization"
	// HeaderCaller carries, on a request one replica forwards to the
	// owner, the original caller's token ("Bearer <token>"): the owner
	// reviews it and decides on the caller, not the forwarder.
	HeaderCaller = "x-skipper-caller-authorization"
)

// TokenFile is gRPC per-call credentials from a projected ServiceAccount
// token file, read again every tokenReread (the kubelet replaces it
// before it expires). An empty path sends no token.
type TokenFile struct {
	path string

	mu   sync.Mutex
	tok  string
	read time.Time
}

// tokenReread is how often a token file is read again.
const tokenReread = 10 * time.Second

// NewTokenFile reads the token at path on each call's need.
func NewTokenFile(path string) *TokenFile { return &TokenFile{path: path} }

// Token returns the file's token, read at most every tokenReread.
func (t *TokenFile) Token() (string, error) {
	if t.path == "" {
		return "", nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tok != "" && time.Since(t.read) < tokenReread {
		return t.tok, nil
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		if t.tok != "" {
			return t.tok, nil // mid-rotation: the last one is still good for a while
		}
		return "", fmt.Errorf("read token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", t.path)
	}
	t.tok, t.read = tok, time.Now()
	return tok, nil
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (t *TokenFile) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok, err := t.Token()
	if err != nil || tok == "" {
		return nil, err
	}
	return map[string]string{HeaderAuthorization: "Bearer " + tok}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: TLS
// on the controllers' port is optional (the token is short-lived and
// bound to the pod; docs/security.md says what that leaves).
func (t *TokenFile) RequireTransportSecurity() bool { return false }
