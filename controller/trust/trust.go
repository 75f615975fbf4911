package trust

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// Audience is the audience routers' and controllers' tokens are minted for
// and reviewed against.
const Audience = skipperv1.Audience

// The extra fields of a token bound to a pod, as TokenReview reports them.
const (
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
	extraNodeName = "authentication.kubernetes.io/node-name"
)

// Bounds of the review cache.
const (
	// DefaultMaxEntries bounds the reviews kept, and separately the
	// refusals.
	DefaultMaxEntries = 10_000
	// deniedTTL is how long a refused token stays refused without another
	// review: a flood of bad tokens costs the API server one review each
	// per deniedTTL at most (and none once the keys are loaded: a token
	// they do not verify is never sent to TokenReview).
	deniedTTL = 10 * time.Second
	// freshTTL is how long a review is taken without asking again while
	// the API server answers (so a deleted pod's token stops working
	// within it); past it and until the token expires, the review is
	// honoured only while the API server cannot be asked.
	freshTTL = 2 * time.Minute
	// refreshAfter is how old a review gets before a call that finds it
	// has it reviewed again in the background (refresh): a caller that
	// keeps calling never waits for a review after its first, and a
	// deleted pod's token still stops working within freshTTL.
	refreshAfter = freshTTL / 2
	// downFor is how long, after the API server failed a review, reviews
	// are not tried: calls meanwhile are answered from the cache or the
	// keys at once, not each after a review's timeout.
	downFor = 5 * time.Second
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

	mu         sync.Mutex
	cache      map[[sha256.Size]byte]entry   // reviews that passed
	refused    map[[sha256.Size]byte]refusal // tokens refused, kept apart so a flood of them evicts no review
	down       time.Time                     // reviews are not tried before this
	refreshing map[[sha256.Size]byte]bool    // reviews again in the background (refresh)
	closed     bool                          // Close was called: no refresh starts
	wg         sync.WaitGroup                // the refreshes
}

type entry struct {
	id      Identity
	refresh time.Time // reviewed again in the background from this on
	fresh   time.Time // taken without a review until this
	until   time.Time // honoured while the API server is away until this (the token's expiry)
}

// refusal is a refused token: asked again after retry (when the API
// server may say otherwise), never verified locally before exp (what the
// API server refused, its signature does not overrule).
type refusal struct {
	err        error
	retry, exp time.Time
}

// NewAuthenticator reviews tokens with r, keeping at most maxEntries
// reviews (0: DefaultMaxEntries).
func NewAuthenticator(r Reviewer, maxEntries int) *Authenticator {
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	return &Authenticator{r: r, now: time.Now, maxEntries: maxEntries,
		cache: map[[sha256.Size]byte]entry{}, refused: map[[sha256.Size]byte]refusal{},
		refreshing: map[[sha256.Size]byte]bool{}}
}

// Close stops starting background reviews and waits for those running
// (each bounded by the reviewer's timeout).
func (a *Authenticator) Close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.wg.Wait()
}

// VerifyLocally makes a verify, with k's keys, the tokens the API server
// cannot review (it is unreachable) and that were never reviewed.
func (a *Authenticator) VerifyLocally(k *KeySet) { a.local = k }

// Authenticate returns the identity of token's bearer. A fresh review is
// taken from the cache; otherwise the API server reviews the token (under
// the reviewer's own timeout, whatever the caller's deadline). When it
// cannot be asked (unreachable, timing out, overloaded), a review taken
// earlier holds until the token expires, and a token never reviewed, nor
// refused, is verified against the keys (VerifyLocally). A token that
// cannot be a ServiceAccount token for Audience (not a JWT, another
// audience, expired; with the keys loaded, any it does not verify) is
// refused without a review. Errors wrap ErrUnauthenticated or
// ErrUnavailable.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (Identity, error) {
	if token == "" {
		return Identity{}, fmt.Errorf("%w: no bearer token", ErrUnauthenticated)
	}
	key := sha256.Sum256([]byte(token))
	now := a.now()
	a.mu.Lock()
	e, reviewedOK := a.cache[key]
	r, refusedOK := a.refused[key]
	down := now.Before(a.down)
	a.mu.Unlock()
	switch {
	case reviewedOK && now.Before(e.fresh):
		if !now.Before(e.refresh) && !down {
			a.refresh(key, token, now)
		}
		return e.id, nil
	case refusedOK && now.Before(r.retry):
		return Identity{}, r.err
	}
	if err := a.precheck(token, now); err != nil {
		a.refuse(key, err, token, now)
		return Identity{}, err
	}
	var st authenticationv1.TokenReviewStatus
	err := errAPIDown
	if !down {
		st, err = a.r.Review(context.WithoutCancel(ctx), token)
	}
	if err != nil {
		if !apiUnavailable(err) {
			// The controller's own problem (its RBAC, a bad request): not
			// the caller's, and no reason to trust the token otherwise.
			return Identity{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		if !down {
			a.mu.Lock()
			a.down = a.now().Add(downFor) // from the failure: a review that timed out took its timeout
			a.mu.Unlock()
		}
		switch {
		case reviewedOK && now.Before(e.until):
			return e.id, nil // reviewed before: honoured through the outage
		case refusedOK && now.Before(r.exp):
			return Identity{}, r.err
		case a.local == nil || !a.local.Loaded():
			return Identity{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		// Never reviewed (a renewed token, a replica it never called):
		// its signature decides, until the API server can be asked.
		id, verr := a.local.Verify(token, now)
		if verr != nil {
			a.refuse(key, verr, token, now)
			return Identity{}, verr
		}
		a.mu.Lock()
		a.putLocked(key, entry{id: id, fresh: now, until: id.Expires}, now)
		a.mu.Unlock()
		return id, nil
	}
	return a.take(key, token, st, now)
}

// take keeps the API server's review st of token (its cache key) made at
// now: the identity, or the refusal.
func (a *Authenticator) take(key [sha256.Size]byte, token string, st authenticationv1.TokenReviewStatus, now time.Time) (Identity, error) {
	id, rerr := reviewed(st, token)
	a.mu.Lock()
	a.keepLocked(key, token, id, rerr, now)
	a.mu.Unlock()
	return id, rerr
}

// keepLocked stores a review's outcome: the identity, fresh for freshTTL
// and renewed in the background after refreshAfter, or the refusal, which
// ends any review cached before. a.mu is held.
func (a *Authenticator) keepLocked(key [sha256.Size]byte, token string, id Identity, rerr error, now time.Time) {
	if rerr != nil {
		delete(a.cache, key)
		a.refuseLocked(key, rerr, token, now)
		return
	}
	until := now.Add(freshTTL)
	if !id.Expires.IsZero() {
		until = id.Expires
	}
	fresh := now.Add(freshTTL)
	if until.Before(fresh) {
		fresh = until
	}
	delete(a.refused, key)
	a.putLocked(key, entry{id: id, refresh: now.Add(refreshAfter), fresh: fresh, until: until}, now)
}

// refresh reviews token again in the background, once at a time per
// token: the call that found its review old is answered from it at once.
// A refusal ends whatever is cached; an identity replaces the cached
// review only if that is still the one the refresh renews (none evicted
// it, no call reviewed the token meanwhile); a review that fails to reach
// the API server leaves it as it
// is (the next call past refreshAfter tries again, after downFor). The
// review counts as made at now, the call's time (a little early: it only
// ever ends sooner).
func (a *Authenticator) refresh(key [sha256.Size]byte, token string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.refreshing[key] {
		return
	}
	renews := a.cache[key].refresh
	a.refreshing[key] = true
	a.wg.Go(func() {
		st, err := a.r.Review(context.Background(), token)
		var id Identity
		var rerr error
		if err == nil {
			id, rerr = reviewed(st, token)
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.refreshing, key)
		switch cur, ok := a.cache[key]; {
		case err != nil:
			if apiUnavailable(err) {
				a.down = a.now().Add(downFor)
			}
		case rerr != nil:
			// A refusal stands whatever changed meanwhile (a review
			// verified locally since, say): what the API server refused,
			// nothing cached overrules.
			a.keepLocked(key, token, id, rerr, now)
		case ok && cur.refresh.Equal(renews):
			a.keepLocked(key, token, id, rerr, now)
		}
	})
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

// errAPIDown stands for a review not tried: the API server failed one
// within downFor.
var errAPIDown = errors.New("the API server failed a review moments ago")

// apiUnavailable reports whether a review failed because the API server
// could not answer it (not because it refused the controller).
func apiUnavailable(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, errAPIDown), errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne):
		return true
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsServiceUnavailable(err),
		apierrors.IsTooManyRequests(err), apierrors.IsInternalError(err), apierrors.IsUnexpectedServerError(err):
		return true
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return se.Status().Code >= 500
	}
	return true // not an API answer at all: the connection failed
}

// precheck refuses, without asking the API server, a token that cannot be
// a ServiceAccount token for Audience.
func (a *Authenticator) precheck(token string, now time.Time) error {
	if a.local != nil && a.local.Loaded() {
		_, err := a.local.Verify(token, now)
		return err
	}
	c, err := unverifiedClaims(token)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	if !c.audience(Audience) {
		return fmt.Errorf("%w: token is not for audience %q", ErrUnauthenticated, Audience)
	}
	if c.Exp == 0 || !now.Before(time.Unix(c.Exp, 0)) {
		return fmt.Errorf("%w: token expired", ErrUnauthenticated)
	}
	return nil
}

// refuse keeps a refusal of token: asked again after deniedTTL, never
// verified locally before it expires.
func (a *Authenticator) refuse(key [sha256.Size]byte, err error, token string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refuseLocked(key, err, token, now)
}

// refuseLocked is refuse with a.mu held.
func (a *Authenticator) refuseLocked(key [sha256.Size]byte, err error, token string, now time.Time) {
	exp := now.Add(deniedTTL)
	if c, cerr := unverifiedClaims(token); cerr == nil && c.Exp > 0 && time.Unix(c.Exp, 0).After(exp) {
		exp = time.Unix(c.Exp, 0)
	}
	if len(a.refused) >= a.maxEntries {
		clear(a.refused) // refusals are cheap to learn again; reviews are kept
	}
	a.refused[key] = refusal{err: err, retry: now.Add(deniedTTL), exp: exp}
}

// Len is how many reviews are cached.
func (a *Authenticator) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.cache)
}

// reviewed reads a review: the identity, or why the token is refused.
func reviewed(st authenticationv1.TokenReviewStatus, token string) (Identity, error) {
	if !st.Authenticated {
		reason := st.Error
		if reason == "" {
			reason = "token not authenticated"
		}
		return Identity{}, fmt.Errorf("%w: %s", ErrUnauthenticated, reason)
	}
	// An empty list means an authenticator that does not know audiences
	// took it for the API server's own: not a token for Audience.
	if !slices.Contains(st.Audiences, Audience) {
		return Identity{}, fmt.Errorf("%w: token is not for audience %q (reviewed for %v)", ErrUnauthenticated, Audience, st.Audiences)
	}
	id := identityOf(st.User)
	if exp, ok := tokenExpiry(token); ok {
		id.Expires = exp
	}
	return id, nil
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

// jwtClaims are the claims read from a token before any check.
type jwtClaims struct {
	Aud json.RawMessage `json:"aud"`
	Exp int64           `json:"exp"`
}

func (c jwtClaims) audience(want string) bool {
	var aud []string
	if json.Unmarshal(c.Aud, &aud) != nil {
		var one string
		if json.Unmarshal(c.Aud, &one) != nil {
			return false
		}
		aud = []string{one}
	}
	return slices.Contains(aud, want)
}

// unverifiedClaims reads a JWT's claims without checking its signature.
func unverifiedClaims(token string) (jwtClaims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return jwtClaims{}, errors.New("not a JWT")
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return jwtClaims{}, errors.New("not a JWT: bad payload encoding")
	}
	var c jwtClaims
	if err := json.Unmarshal(b, &c); err != nil {
		return jwtClaims{}, errors.New("not a JWT: bad claims")
	}
	return c, nil
}

// tokenExpiry reads a JWT's exp claim without checking its signature:
// TokenReview has checked the token; only how long to keep the review is
// read here.
func tokenExpiry(token string) (time.Time, bool) {
	c, err := unverifiedClaims(token)
	if err != nil || c.Exp <= 0 {
		return time.Time{}, false
	}
	return time.Unix(c.Exp, 0), true
}
