package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// pod when the set is empty (after leaving out unusable). Claims for one
// function are serialised: concurrent callers share the claim in flight
// rather than each claiming a pod.
func (c *controller) ensureInstance(ctx context.Context, fn *v1alpha1.Function, port int32, node string, unusable []string) ([]instance, bool, error) {
	if set := c.currentSet(fn, port, unusable); len(set) > 0 {
		return set, false, nil
	}
	for {
		f, leader := c.joinFlight(fn, port, node, unusable)
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

// joinFlight returns the claim in flight for fn, starting one if none is.
// The claim runs under the controller's context, not the caller's, so a
// caller that gives up does not waste a claim others wait on; it is bounded
// by --claim-timeout plus --assign-timeout.
func (c *controller) joinFlight(fn *v1alpha1.Function, port int32, node string, unusable []string) (*flight, bool) {
	key := fn.Key()
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.flights[key]; ok {
		return f, false
	}
	f := &flight{done: make(chan struct{})}
	c.flights[key] = f
	c.wg.Go(func() {
		ctx, cancel := context.WithTimeout(c.runCtx, c.cfg.ClaimTimeout+c.cfg.AssignTimeout)
		defer cancel()
		err := c.claim(ctx, fn, port, node, unusable)
		c.mu.Lock()
		delete(c.flights, key)
		c.mu.Unlock()
		f.err = err
		close(f.done)
	})
	return f, true
}

// claim claims one pool pod for fn and assigns it, waiting up to
// --claim-timeout for a pool pod to become Ready when none is.
func (c *controller) claim(ctx context.Context, fn *v1alpha1.Function, port int32, node string, unusable []string) error {
	poolKey := fn.Namespace + "/" + fn.Spec.Pool
	deadline := time.NewTimer(c.cfg.ClaimTimeout)
	defer deadline.Stop()
	start := time.Now()
	waiting := false
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
		if set := c.currentSet(fn, port, unusable); len(set) > 0 {
			return nil
		}
		for _, p := range claimCandidates(fn.Spec.Pool, c.cache.poolPods(fn.Namespace, fn.Spec.Pool), node, c.assumedUIDs()) {
			claimed, err := c.claimPod(ctx, p, fn)
			if errors.Is(err, errClaimLost) {
				c.log.Debug("claim lost, trying next pod", "function", fn.Key(), "pod", p.Name, "err", err)
				continue
			}
			if err != nil {
				return err
			}
			if err := c.assignPod(ctx, claimed, fn, port); err != nil {
				c.deleteOrphan(claimed, err)
				return withReason(ErrAssign, "assign pod %s/%s to function %s: %v", claimed.Namespace, claimed.Name, fn.Key(), err)
			}
			c.assume(fn.Key(), claimed, time.Now())
			c.fnQueue.Add(fn.Key())
			c.log.Info("claimed pod", "function", fn.Key(), "pod", claimed.Name, "node", claimed.Spec.NodeName,
				"waited", time.Since(start))
			return nil
		}
		if !waiting {
			waiting = true
			c.metrics.poolWaiters.WithLabelValues(poolKey).Inc()
		}
		select {
		case <-changed:
		case <-deadline.C:
			return withReason(ErrPoolEmpty, "pool %s has no ready pods (waited %s for function %s)", poolKey, c.cfg.ClaimTimeout, fn.Key())
		case <-ctx.Done():
			return fmt.Errorf("claim for function %s: %w", fn.Key(), ctx.Err())
		}
	}
}

// errClaimLost means another writer changed the pod first; try the next.
var errClaimLost = errors.New("pod changed since cached")

// claimPod applies the claim patch to pod and returns the claimed pod.
func (c *controller) claimPod(ctx context.Context, pod *corev1.Pod, fn *v1alpha1.Function) (*corev1.Pod, error) {
	patch, err := claimPatch(pod, fn)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errClaimLost, err)
	}
	claimed, err := c.core.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
	switch {
	case err == nil:
		return claimed, nil
	// A failed test op is 422 Invalid; a concurrent write can surface as 409;
	// a pod deleted since it was cached is 404. All mean: pick another.
	case apierrors.IsInvalid(err), apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: claim pod %s/%s: %v", errClaimLost, pod.Namespace, pod.Name, err)
	}
	return nil, fmt.Errorf("claim pod %s/%s: %w", pod.Namespace, pod.Name, err)
}

// assignPod posts the assignment to the claimed pod and expects 200.
func (c *controller) assignPod(ctx context.Context, pod *corev1.Pod, fn *v1alpha1.Function, port int32) error {
	now := time.Now()
	token, err := assign.Sign(c.key, assign.Claims{
		Audience: string(pod.UID),
		Function: fn.Key(),
		IssuedAt: now.Unix(),
		Expiry:   now.Add(tokenLifetime).Unix(),
	})
	if err != nil {
		return err
	}
	body, err := json.Marshal(assign.Request{
		Token:          token,
		Function:       fn.Key(),
		Port:           port,
		Oneshot:        fn.Spec.Oneshot,
		TimeoutSeconds: fn.Spec.TimeoutOrZero().Seconds(),
		Config:         fn.Spec.Config,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AssignTimeout)
	defer cancel()
	url := "http://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(port))) + assign.Path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// deleteOrphan deletes a claimed pod whose assignment failed: the pool has
// released it and no function can use it. It runs even when the claim's
// context ended, bounded by --assign-timeout.
func (c *controller) deleteOrphan(pod *corev1.Pod, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.runCtx), c.cfg.AssignTimeout)
	defer cancel()
	uid := pod.UID
	err := c.core.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid},
	})
	// Until the informer shows it gone, the pod must not be handed out.
	c.retire(pod.UID, time.Now())
	if err != nil && !apierrors.IsNotFound(err) {
		c.log.Error("delete pod whose assignment failed", "pod", pod.Namespace+"/"+pod.Name, "cause", cause, "err", err)
		return
	}
	c.log.Warn("deleted pod whose assignment failed", "pod", pod.Namespace+"/"+pod.Name, "cause", cause)
}
