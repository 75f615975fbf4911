package trust

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TokenReviewer reviews tokens for Audience with the API server.
type TokenReviewer struct {
	CS      kubernetes.Interface
	Timeout time.Duration // per review; 0: 5s
}

// Review implements Reviewer.
func (r TokenReviewer) Review(ctx context.Context, token string) (authenticationv1.TokenReviewStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(r.Timeout, 5*time.Second))
	defer cancel()
	out, err := r.CS.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return authenticationv1.TokenReviewStatus{}, fmt.Errorf("TokenReview: %w", err)
	}
	return out.Status, nil
}

// The access a sidecar router's ServiceAccount must have (granted by the
// opt-in ClusterRole skipper-sidecar-router, bound per namespace):
// verb "connect" on resource "routers" of group skipper.dev, in its own
// namespace.
const (
	SidecarGroup    = "skipper.dev"
	SidecarResource = "routers"
	SidecarVerb     = "connect"
)

// accessTTL is how long an access review's answer is kept; a kept answer
// is honoured past it while the API server cannot be asked.
const accessTTL = time.Minute

// SidecarAccess asks the API server (SubjectAccessReview) whether an
// identity may act as a sidecar router, caching answers by user.
type SidecarAccess struct {
	CS      kubernetes.Interface
	Timeout time.Duration
	now     func() time.Time

	mu    sync.Mutex
	cache map[string]accessEntry
}

type accessEntry struct {
	allowed bool
	at      time.Time
}

// Allowed reports whether id may connect as a sidecar router. An error
// wraps ErrUnavailable: the API server could not be asked and nothing was
// kept.
func (s *SidecarAccess) Allowed(ctx context.Context, id Identity) (bool, error) {
	now := time.Now()
	if s.now != nil {
		now = s.now()
	}
	key := id.User + "\x00" + strings.Join(id.Groups, "\x00")
	s.mu.Lock()
	e, ok := s.cache[key]
	s.mu.Unlock()
	if ok && now.Sub(e.at) < accessTTL {
		return e.allowed, nil
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(s.Timeout, 5*time.Second))
	defer cancel()
	out, err := s.CS.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: id.User, Groups: id.Groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: id.Namespace, Group: SidecarGroup, Resource: SidecarResource, Verb: SidecarVerb,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		if ok {
			return e.allowed, nil // the API server is away: the last answer holds
		}
		return false, fmt.Errorf("%w: SubjectAccessReview: %v", ErrUnavailable, err)
	}
	s.mu.Lock()
	if s.cache == nil || len(s.cache) >= DefaultMaxEntries {
		s.cache = map[string]accessEntry{}
	}
	s.cache[key] = accessEntry{allowed: out.Status.Allowed, at: now}
	s.mu.Unlock()
	return out.Status.Allowed, nil
}
