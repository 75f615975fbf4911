// Package trust authenticates the callers of the controllers' gRPC port
// (issue 16): routers, sidecar routers and other controller replicas send a
// projected ServiceAccount token (audience "skipper") as gRPC metadata
// `authorization: Bearer <token>`; a controller reviews it with the API
// server's TokenReview and takes the caller's identity from the review
// (ServiceAccount, and for a token bound to a pod, the pod and its node).
//
// Reviews are cached by the token's SHA-256 until the token expires
// (bounded), and a cached review is honoured while the API server is
// unreachable, so routers keep working through an outage. What an identity
// may do is the controller's policy; this package only says who it is.
package trust

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
)

// Audience is the audience routers' and controllers' tokens are minted for
// and reviewed against.
const Audience = "skipper"

// The extra fields of a token bound to a pod, as TokenReview reports them.
const (
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
	extraNodeName = "authentication.kubernetes.io/node-name"
)

// Bounds of the review cache.
const (
	// DefaultMaxEntries bounds the reviews kept.
	DefaultMaxEntries = 10_000
	// deniedTTL is how long a refused token stays refused without another
	// review: a flood of bad tokens costs the API server one review each
	// per deniedTTL at most.
	deniedTTL = 10 * time.Second
	// opaqueTTL is how long a review of a token without a readable expiry
	// (not a JWT) is kept.
	opaqueTTL = 5 * time.Minute
)

// Identity is who a caller is, by the API server's review of its token.
type Identity struct {
	User   string
	Groups []string
	// Namespace and ServiceAccount are set for a ServiceAccount's token.
	Namespace, ServiceAccount string
	// Pod, PodUID and Node are set for a token bound to a pod (projected
	// tokens are); Pod is the pod's name, in Namespace.
	Pod, PodUID, Node string
	// Expires is when the token does.
	Expires time.Time
}

// IsServiceAccount reports whether the caller is ServiceAccount ns/name.
func (id Identity) IsServiceAccount(ns, name string) bool {
	return id.ServiceAccount != "" && id.Namespace == ns && id.ServiceAccount == name
}

// InGroup reports whether the caller is in group g.
func (id Identity) InGroup(g string) bool {
	return slices.Contains(id.Groups, g)
}

// String names the caller for logs and errors.
func (id Identity) String() string {
	if id.Pod != "" {
		return fmt.Sprintf("%s (pod %s/%s on node %s)", id.User, id.Namespace, id.Pod, id.Node)
	}
	return id.User
}

// ErrUnauthenticated is a missing, malformed or refused token.
var ErrUnauthenticated = errors.New("unauthenticated")

// ErrUnavailable is a token that could not be reviewed (the API server
// unreachable) and has no cached review.
var ErrUnavailable = errors.New("token review unavailable")

// Reviewer reviews a token for Audience: the API server's TokenReview.
type Reviewer interface {
	Review(ctx context.Context, token string) (authenticationv1.TokenReviewStatus, error)
}

// Authenticator answers who a token's bearer is.
type Authenticator struct {
	r          Reviewer
	local      *KeySet // verifies tokens never reviewed while the API server is away; nil: none
	now        func() time.Time
	maxEntries int

	mu    sync.Mutex
	cache map[[sha256.Size]byte]entry
}

type entry struct {
	id    Identity
	err   error // ErrUnauthenticated with the reason, for a refused token
	until time.Time
}

// NewAuthenticator reviews tokens with r, keeping at most maxEntries
// reviews (0: DefaultMaxEntries).
func NewAuthenticator(r Reviewer, maxEntries int) *Authenticator {
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	return &Authenticator{r: r, now: time.Now, maxEntries: maxEntries, cache: map[[sha256.Size]byte]entry{}}
}

// VerifyLocally makes a verify, with k's keys, the tokens the API server
// cannot review (it is unreachable) and that were never reviewed.
func (a *Authenticator) VerifyLocally(k *KeySet) { a.local = k }

// Authenticate returns the identity of token's bearer: from the cache
// while the review is fresh (a token's review until it expires, a refusal
// for deniedTTL), else from a new review. Errors wrap ErrUnauthenticated
// or ErrUnavailable.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (Identity, error) {
	if token == "" {
		return Identity{}, fmt.Errorf("%w: no bearer token", ErrUnauthenticated)
	}
	key := sha256.Sum256([]byte(token))
	now := a.now()
	a.mu.Lock()
	e, ok := a.cache[key]
	a.mu.Unlock()
	if ok && now.Before(e.until) {
		return e.id, e.err
	}
	st, err := a.r.Review(ctx, token)
	if err != nil {
		if a.local == nil || !a.local.Loaded() {
			return Identity{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		// The API server is away and this token was never reviewed (a
		// renewed token, a replica it never called): its signature
		// decides, for localTTL.
		id, verr := a.local.Verify(token, now)
		e = entry{id: id, err: verr, until: now.Add(localTTL)}
		if verr != nil {
			e.until = now.Add(deniedTTL)
		} else if id.Expires.Before(e.until) {
			e.until = id.Expires
		}
		a.mu.Lock()
		a.putLocked(key, e, now)
		a.mu.Unlock()
		return e.id, e.err
	}
	e = reviewed(st, token, now)
	a.mu.Lock()
	a.putLocked(key, e, now)
	a.mu.Unlock()
	return e.id, e.err
}

// putLocked stores e, making room by dropping expired reviews and then,
// if still full, arbitrary ones.
func (a *Authenticator) putLocked(key [sha256.Size]byte, e entry, now time.Time) {
	if len(a.cache) >= a.maxEntries {
		for k, x := range a.cache {
			if !now.Before(x.until) {
				delete(a.cache, k)
			}
		}
		for k := range a.cache {
			if len(a.cache) < a.maxEntries {
				break
			}
			delete(a.cache, k)
		}
	}
	a.cache[key] = e
}

// Len is how many reviews are cached.
func (a *Authenticator) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.cache)
}

// reviewed turns a review into a cache entry.
func reviewed(st authenticationv1.TokenReviewStatus, token string, now time.Time) entry {
	if !st.Authenticated {
		reason := st.Error
		if reason == "" {
			reason = "token not authenticated"
		}
		return entry{err: fmt.Errorf("%w: %s", ErrUnauthenticated, reason), until: now.Add(deniedTTL)}
	}
	if len(st.Audiences) > 0 && !slices.Contains(st.Audiences, Audience) {
		return entry{err: fmt.Errorf("%w: token is not for audience %q", ErrUnauthenticated, Audience), until: now.Add(deniedTTL)}
	}
	id := identityOf(st.User)
	until := now.Add(opaqueTTL)
	if exp, ok := tokenExpiry(token); ok {
		until = exp
		id.Expires = exp
	}
	return entry{id: id, until: until}
}

// identityOf reads a reviewed user.
func identityOf(u authenticationv1.UserInfo) Identity {
	id := Identity{User: u.Username, Groups: append([]string(nil), u.Groups...)}
	if rest, ok := strings.CutPrefix(u.Username, "system:serviceaccount:"); ok {
		if ns, name, ok := strings.Cut(rest, ":"); ok && ns != "" && name != "" && !strings.Contains(name, ":") {
			id.Namespace, id.ServiceAccount = ns, name
		}
	}
	one := func(k string) string {
		if v := u.Extra[k]; len(v) == 1 {
			return v[0]
		}
		return ""
	}
	if id.ServiceAccount != "" {
		id.Pod, id.PodUID, id.Node = one(extraPodName), one(extraPodUID), one(extraNodeName)
	}
	return id
}

// tokenExpiry reads a JWT's exp claim without checking its signature:
// TokenReview has checked the token; only how long to keep the review is
// read here.
func tokenExpiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var c struct {
		Exp *json.Number `json:"exp"`
	}
	if err := json.Unmarshal(b, &c); err != nil || c.Exp == nil {
		return time.Time{}, false
	}
	sec, err := c.Exp.Int64()
	if err != nil || sec <= 0 {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}
