package controller

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
)

// tokenLifetime is how long an assign token is valid.
const tokenLifetime = time.Minute

// validateRef checks a function reference before anything is looked up.
func validateRef(ns, name string) error {
	var problems []string
	if ns == "" {
		problems = append(problems, "namespace is empty")
	} else if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
		problems = append(problems, fmt.Sprintf("namespace %q: %s", ns, strings.Join(msgs, "; ")))
	}
	if name == "" {
		problems = append(problems, "name is empty")
	} else {
		// A Function's name becomes the value of the skipper.dev/function
		// label, so it must be a valid label value as well as an object name.
		msgs := append(validation.IsDNS1123Subdomain(name), validation.IsValidLabelValue(name)...)
		if len(msgs) > 0 {
			problems = append(problems, fmt.Sprintf("name %q: %s", name, strings.Join(msgs, "; ")))
		}
	}
	if len(problems) > 0 {
		return withReason(ErrInvalidName, "invalid function reference: %s", strings.Join(problems, ", "))
	}
	return nil
}

func splitKey(key string) (ns, name string, ok bool) {
	return strings.Cut(key, "/")
}

// ensureInstance returns the function's ready instance set, claiming a pool
// pod when the set is empty (after leaving out unusable). A caller never
// claims while another claim for the function is in flight (the
// supervisor's or another caller's): it waits for that one, so concurrent
// callers share claims rather than each claiming a pod. admit, when not
// nil, is asked before each claim this caller starts (the caller's claim
// rate limit); its error is returned.
func (c *controller) ensureInstance(ctx context.Context, fn *v1alpha1.Function, port int32, node string, unusable []string, admit func() error) ([]instance, bool, error) {
	if set := c.currentSet(fn, port, unusable); len(set) > 0 {
		return set, false, nil
	}
	for {
		f, leader, err := c.joinFlight(fn, port, node, unusable, admit)
		if err != nil {
			return nil, false, err
		}
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-f.done:
		}
		// The flight ran because the set was empty, so its error stands even
		// if the informer meanwhile shows the pod it claimed and gave up.
		if f.err != nil {
			return nil, false, f.err
		}
		if set := c.currentSet(fn, port, unusable); len(set) > 0 {
			return set, leader, nil
		}
		// The flight claimed for another caller's view (say, a pod this
		// caller found unusable): claim again.
	}
}

// flightKind says what a claim is for.
type flightKind int

const (
	// flightCold: GetInstance found the set empty; the claim gives up as
	// soon as the set holds an instance.
	flightCold flightKind = iota
	// flightScale: the supervisor scales up; the claim always claims.
	flightScale
	// flightOneshot: a fresh instance for one call, never in the shared set.
	flightOneshot
)

// joinFlight returns a claim in flight for fn, starting a cold one if none
// is and admit (when not nil) lets it.
func (c *controller) joinFlight(fn *v1alpha1.Function, port int32, node string, unusable []string, admit func() error) (*flight, bool, error) {
	f, leader, err := c.claims.join(fn.Key(), admit)
	if leader {
		c.fly(f, fn, port, node, "", unusable)
	}
	return f, leader, err
}

// startFlight starts one claim of kind for fn (see fly).
func (c *controller) startFlight(fn *v1alpha1.Function, port int32, kind flightKind, node, router string, unusable []string) *flight {
	f := c.claims.start(fn.Key(), kind)
	c.fly(f, fn, port, node, router, unusable)
	return f
}

// fly runs the claim of flight f, which c.claims registered: until it
// ends, the flight counts as an expected instance of fn. The claim runs
// under the controller's context, not a caller's, so a caller that gives
// up does not waste a claim others wait on; it is bounded by
// --claim-timeout plus --assign-timeout. When it succeeds, the claimed pod
// becomes assumed in the same critical section that ends the flight
// (claims.land), so the expectation is never dropped in between.
func (c *controller) fly(f *flight, fn *v1alpha1.Function, port int32, node, router string, unusable []string) {
	key := fn.Key()
	c.wg.Go(func() {
		ctx, cancel := context.WithTimeout(c.runCtx, c.cfg.ClaimTimeout+c.cfg.AssignTimeout)
		defer cancel()
		start := time.Now()
		pod, err := c.claim(ctx, fn, port, f.kind, node, router, unusable)
		c.claims.land(key, f, pod, time.Now())
		if pod != nil {
			c.fnQueue.Add(key)
		}
		c.claimDone(fn, err)
		f.pod, f.err = pod, err
		close(f.done)
		// Logged once the waiters are free: a cold start waits for no log
		// write.
		if pod != nil {
			c.log.Info("claimed pod", "function", key, "pod", pod.Name, "node", pod.Spec.NodeName,
				"waited", time.Since(start), "oneshot", f.kind == flightOneshot)
		}
	})
}

// scaleUp starts claims towards want expected instances of fn (observed,
// assumed and in flight), at most as many as claimsToStart allows: no more
// than the pool has candidates for, and no more than --max-parallel-claims
// leaves beside the claims in flight across the replica. It returns how
// many it started; the next tick starts more. The count and the new
// flights are one critical section (claims.startScale), so concurrent
// callers never claim for the same need twice, however far the informer
// lags, and nothing is allocated per missing instance.
func (c *controller) scaleUp(fn *v1alpha1.Function, port int32, want int) int {
	pods := c.cache.functionPods(fn.Namespace, fn.Name)
	pool := c.cache.poolPods(fn.Namespace, fn.Spec.Pool)
	fs := c.claims.startScale(fn, pods, pool, want, c.cfg.MaxParallelClaims, time.Now())
	for _, f := range fs {
		c.fly(f, fn, port, "", "", nil)
	}
	return len(fs)
}

// containsPod reports whether pods holds the pod with uid.
func containsPod(pods []*corev1.Pod, uid types.UID) bool {
	return slices.ContainsFunc(pods, func(p *corev1.Pod) bool { return p.UID == uid })
}

// countsAsInstance reports whether a cached pod is one of fn's instances
// for scaling: claimed by this Function, not terminating, not restarted.
func countsAsInstance(p *corev1.Pod, fn *v1alpha1.Function) bool {
	return p.Labels[v1alpha1.LabelFunction] == fn.Name && ownedBy(p, fn) && p.DeletionTimestamp == nil && !restartedSinceClaim(p)
}

// claim claims one pool pod for fn and assigns it, waiting up to
// --claim-timeout for a pool pod to become Ready when none is. A cold
// claim returns (nil, nil) once the set holds an instance. At most
// --max-parallel-claims claims assign at once (their records follow in the
// background, outside that bound).
func (c *controller) claim(ctx context.Context, fn *v1alpha1.Function, port int32, kind flightKind, node, router string, unusable []string) (*corev1.Pod, error) {
	poolKey := fn.Namespace + "/" + fn.Spec.Pool
	deadline := time.NewTimer(c.cfg.ClaimTimeout)
	defer deadline.Stop()
	waiting := false
	passedOver := false // a pod whose assign reached nobody: one per claim
	defer func() {
		if waiting {
			c.metrics.poolWaiters.WithLabelValues(poolKey).Dec()
		}
	}()
	for {
		changed := c.podsChanged.wait() // before reading the cache, so no event is missed
		// Checked on every pass: while this replica waits, the informer may
		// catch up with a claim made just before, or made by another replica
		// answering a forwarded request.
		if kind == flightCold && len(c.currentSet(fn, port, unusable)) > 0 {
			return nil, nil
		}
		tried := map[string]bool{} // pods this pass lost: the cache may still show them as they were
		for {
			p := c.claims.reserve(fn, c.cache.poolPods(fn.Namespace, fn.Spec.Pool), node, tried, time.Now())
			if p == nil {
				break
			}
			tried[string(p.UID)] = true
			claimed, err := c.claimReserved(ctx, p, fn, port, router)
			if errors.Is(err, errClaimLost) {
				c.log.Debug("claim lost, trying next pod", "function", fn.Key(), "pod", p.Name, "err", err)
				continue
			}
			var unreached *unreachedError
			if errors.As(err, &unreached) {
				// Once per claim: a pod the cache lists but that is gone is
				// passed over; a second means the pool's port, a policy or
				// the network fails every pod, and the call is answered
				// rather than the pool deleted.
				if !passedOver {
					passedOver = true
					c.log.Info("assign reached no instance, trying the next pod", "function", fn.Key(), "pod", p.Name, "err", unreached.error)
					continue
				}
				return nil, unreached.error
			}
			if err != nil {
				return nil, err
			}
			return claimed, nil
		}
		if !waiting {
			waiting = true
			c.metrics.poolWaiters.WithLabelValues(poolKey).Inc()
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil, withReason(ErrPoolEmpty, "pool %s has no ready pods (waited %s for function %s)", poolKey, c.cfg.ClaimTimeout, fn.Key())
		case <-ctx.Done():
			return nil, fmt.Errorf("claim for function %s: %w", fn.Key(), ctx.Err())
		}
	}
}

// claimReserved assigns the reserved pod p to fn, holding a slot of
// --max-parallel-claims, and returns the pod as its record will make it
// (claimedCopy), which the flight's end assumes. It releases the
// reservation when it fails.
//
// Issue 15: the instance decides the claim. An assign it accepts (200)
// makes the pod fn's; the record (label, ownerReference, annotations)
// follows on its own (record), off the caller's path and retried until it
// lands, so a cold start waits for no API server write and survives one
// that is slow or down. A 409 names the function the instance holds: the
// race is lost (or an earlier claim was never recorded, and is adopted):
// the claim moves to the next pod.
func (c *controller) claimReserved(ctx context.Context, p *corev1.Pod, fn *v1alpha1.Function, port int32, router string) (_ *corev1.Pod, err error) {
	defer func() {
		if err != nil {
			c.claims.unreserve(p.UID)
		}
	}()
	select {
	case c.claimSlots <- struct{}{}:
		defer func() { <-c.claimSlots }()
	case <-ctx.Done():
		return nil, fmt.Errorf("claim for function %s: waiting for a claim slot: %w", fn.Key(), ctx.Err())
	}
	start := time.Now()
	info := claimInfo{Restarts: restarts(p), Router: router, Callers: callersDigest(&fn.Spec.Callers)}
	if err := c.assignPod(ctx, p, fn, port, rand.Text()); err != nil {
		var held *heldError
		if errors.As(err, &held) {
			if held.function != fn.Key() {
				c.adopt(p, held.function)
			} else {
				// Another claim of this oneshot function won it: its own
				// record follows, unless its controller died first. Left
				// unrecorded past any claim's time, the pod is adopted
				// (recorded for fn, no router: its --oneshot-lease ends it),
				// so a crash never costs the pool a pod for good.
				c.adoptLater(p, held.function)
			}
			return nil, fmt.Errorf("%w: %v", errClaimLost, err)
		}
		if errors.Is(err, errUnreached) && ctx.Err() != nil {
			// The claim ended before a connection: nothing was sent, the
			// pod stays the pool's.
			return nil, fmt.Errorf("claim for function %s: %w", fn.Key(), err)
		}
		// The instance may or may not have accepted: it can serve nobody
		// else either way, and it is still the pool's. Give it up so the
		// pool makes a new one.
		c.deleteOrphan(p, err)
		failed := withReason(ErrAssign, "assign pod %s/%s to function %s: %v", p.Namespace, p.Name, fn.Key(), err)
		if errors.Is(err, errUnreached) {
			// No connection was had, so the assign was never sent: the pod
			// may be gone, whatever the cache says (it lags after an API
			// server outage). The claim may move to the next pod.
			return nil, &unreachedError{failed}
		}
		return nil, failed
	}
	info.At = time.Now()
	if key := poolKeyOf(p); key != "" {
		c.pools.claimed(key, p.UID, info.At, info.At)
		c.poolQueue.Add(key)
	}
	c.startRecord(p, fn, info)
	c.log.Debug("claim timing", "function", fn.Key(), "pod", p.Name, "assign", info.At.Sub(start))
	return claimedCopy(p, fn, info), nil
}

// errUnreached marks an assign that had no connection to the instance:
// nothing was sent.
var errUnreached = errors.New("instance not reached")

// unreachedError is a claim's failure whose assign had no connection.
type unreachedError struct{ error }

func (e *unreachedError) Unwrap() error { return e.error }

// errClaimLost means the pod is not to be had (another function holds
// its instance, or it changed first); try the next.
var errClaimLost = errors.New("pod not claimable")

// heldError is a 409 answer to an assign: the instance holds function.
type heldError struct {
	function string
	msg      string
}

func (e *heldError) Error() string { return e.msg }

// assignPod posts the assignment to the claimed pod and expects 200. The
// POST goes out on the connection preconnect keeps open when there is
// one; when that connection fails after the request was written (the
// instance may have accepted it, or closed the connection as it came),
// the assign is sent once more on a new connection, with a token of its
// own: a repeat for the function the instance holds is a 200, so the
// repeat decides either way.
func (c *controller) assignPod(ctx context.Context, pod *corev1.Pod, fn *v1alpha1.Function, port int32, claim string) error {
	reused, err := c.assignOnce(ctx, pod, fn, port, claim)
	if err != nil && reused && ctx.Err() == nil {
		// Go's Transport already sends a request again when its kept-alive
		// connection failed before any of it was written; this one was
		// written, so the instance may have accepted it: a repeat decides.
		c.log.Debug("assign failed on a kept-alive connection, sending it on a new one", "pod", pod.Name, "err", err)
		_, err = c.assignOnce(ctx, pod, fn, port, claim)
	}
	return err
}

// assignOnce is one POST of assignPod; reused is true when it failed in
// transport on a connection opened before it.
func (c *controller) assignOnce(ctx context.Context, pod *corev1.Pod, fn *v1alpha1.Function, port int32, claim string) (reused bool, _ error) {
	areq := assign.Request{
		Function:       fn.Key(),
		Port:           port,
		Oneshot:        fn.Spec.Oneshot,
		TimeoutSeconds: fn.Spec.TimeoutOrZero().Seconds(),
		Config:         fn.Spec.Config,
		Claim:          claim,
		Callers:        assignCallers(&fn.Spec.Callers),
	}
	// Each assign, a retry or a re-assign with new callers included, gets
	// a token of its own (a fresh id), bound to this very request.
	// In the format the instance's last GET answer asked for (a rolling
	// upgrade in either order: assign.PickFormat).
	token, err := assign.SignRequest(c.preconn.format(pod.UID), c.key.Load().sign, string(pod.UID), areq, time.Now(), tokenLifetime)
	if err != nil {
		return false, err
	}
	areq.Token = token
	body, err := json.Marshal(areq)
	if err != nil {
		return false, err
	}
	// Each attempt has --assign-timeout of its own (within the claim's
	// bound): one that hangs on a connection whose peer vanished leaves
	// the repeat its time.
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AssignTimeout)
	defer cancel()
	url := "http://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(v1alpha1.AssignPort(pod, port)))) + assign.Path
	var gotConn, gotReused bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { gotConn, gotReused = true, i.Reused }})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil && !gotConn {
		return false, fmt.Errorf("POST %s: %w: %w", url, errUnreached, err)
	}
	if err != nil {
		return gotReused, fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode == http.StatusConflict {
		var cf assign.Conflict
		if json.Unmarshal(msg, &cf) == nil && cf.Reason == assign.ReasonAlreadyAssigned && cf.Function != "" {
			return false, &heldError{function: cf.Function, msg: fmt.Sprintf("POST %s: instance holds function %s", url, cf.Function)}
		}
	}
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("POST %s: %s: %s", url, resp.Status, strings.TrimSpace(string(msg)))
	}
	return false, nil
}

// deleteOrphan deletes a claimed pod whose assignment failed: the pool has
// released it and no function can use it. It runs even when the claim's
// context ended, bounded by --assign-timeout.
func (c *controller) deleteOrphan(pod *corev1.Pod, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.runCtx), c.cfg.AssignTimeout)
	defer cancel()
	deleted, err := deleteUID(ctx, c.core.CoreV1().Pods(pod.Namespace), pod.Name, pod.UID)
	// Until the informer shows it gone, the pod must not be handed out.
	c.claims.retire(pod.UID, time.Now().Add(assumedTTL))
	switch {
	case err != nil:
		c.log.Error("delete pod whose assignment failed", "pod", pod.Namespace+"/"+pod.Name, "cause", cause, "err", err)
	case deleted:
		c.log.Warn("deleted pod whose assignment failed", "pod", pod.Namespace+"/"+pod.Name, "cause", cause)
	default:
		c.log.Info("pod whose assignment failed was gone already", "pod", pod.Namespace+"/"+pod.Name, "cause", cause)
	}
}

// deleteOrphans deletes the pods labelled for function key that no Function
// owns (see orphaned). The owner of the key does it, so one replica acts.
func (c *controller) deleteOrphans(ctx context.Context, key string, pods []*corev1.Pod) error {
	for _, p := range orphaned(pods) {
		deleted, err := deleteUID(ctx, c.core.CoreV1().Pods(p.Namespace), p.Name, p.UID)
		if err != nil {
			return fmt.Errorf("delete orphaned instance %s/%s of function %s: %w", p.Namespace, p.Name, key, err)
		}
		if deleted {
			c.log.Info("deleted orphaned instance: labelled for the function, owned by no Function",
				"function", key, "pod", p.Namespace+"/"+p.Name)
		}
	}
	return nil
}
