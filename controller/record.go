package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// The record of a claim (issue 15): the instance decided it, the pod's
// label, ownerReference and annotations follow, written here in the
// background until they land.

// adopt records a pool pod whose instance answered that it holds function
// key (a claim whose record never landed: its controller died between the
// assign and the record): level-triggered recovery, as whoever meets such
// a pod writes the record the instance already decided. A key whose
// Function the cache does not hold is left alone: the pod is kept out of
// this replica's candidates for assumedTTL.
func (c *controller) adopt(p *corev1.Pod, key string) {
	c.claims.hold(p.UID, time.Now().Add(assumedTTL))
	ns, name, ok := splitKey(key)
	if !ok {
		return
	}
	fn, err := c.cache.function(ns, name)
	if err != nil || fn == nil || ns != p.Namespace {
		c.log.Warn("pool pod holds a function this replica cannot record", "pod", p.Namespace+"/"+p.Name, "function", key, "err", err)
		return
	}
	c.log.Info("adopting pool pod whose instance holds a function", "pod", p.Namespace+"/"+p.Name, "function", key)
	c.startRecord(p, fn, claimInfo{At: time.Now(), Restarts: restarts(p)})
}

// adoptLater adopts p for key once no claim can still record it (the
// grace assignStale gives a legacy mark), if the cache then still shows it
// in the pool: a oneshot instance another claim of key won, whose
// controller may have died before its record. The pod stays out of this
// replica's candidates meanwhile.
func (c *controller) adoptLater(p *corev1.Pod, key string) {
	grace := assignGrace(&c.cfg)
	c.claims.hold(p.UID, time.Now().Add(grace+assumedTTL))
	c.wg.Go(func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-c.runCtx.Done():
			return
		case <-t.C:
		}
		ns, _, _ := splitKey(key)
		for _, cur := range c.cache.poolPods(ns, p.Labels[v1alpha1.LabelPool]) {
			if cur.UID == p.UID && recordStateOf(cur, p.UID, &v1alpha1.Function{}) == recordNeeded {
				c.adopt(cur, key)
			}
		}
	})
}

// Backoff of a record that did not land.
const (
	recordBackoffBase = 50 * time.Millisecond
	recordBackoffMax  = 5 * time.Second
)

// doubling is the controller's back-off: base (at most max) at the first
// Step, doubling at each Step after it up to max, for as many steps as
// are taken. No jitter: each back-off is one function's or one pod's.
func doubling(base, max time.Duration) wait.Backoff {
	return wait.Backoff{Duration: min(base, max), Factor: 2, Cap: max, Steps: math.MaxInt32}
}

// startRecord writes the record of pod's claim for fn in the background,
// once per pod at a time. Until it lands the pod stays assumed
// (claims.assumedLocked keeps it past assumedTTL) and out of every
// replica's candidates here.
func (c *controller) startRecord(pod *corev1.Pod, fn *v1alpha1.Function, info claimInfo) {
	if !c.claims.startRecording(pod.UID) {
		return
	}
	c.wg.Go(func() {
		st := recordNeeded
		defer func() { c.claims.recordEnded(fn.Key(), pod.UID, st, time.Now()) }()
		// A record outlives the controller's stop by --assign-timeout, so
		// that a graceful shutdown leaves no claim unrecorded it could
		// still record.
		ctx, cancel := context.WithCancel(context.WithoutCancel(c.runCtx))
		defer cancel()
		defer context.AfterFunc(c.runCtx, func() { time.AfterFunc(c.cfg.AssignTimeout, cancel) })()
		st = c.record(ctx, pod, fn, info)
	})
}

// record writes the claim's record until it lands, the pod is gone or
// holds another function's record, or ctx ends, and returns how it ended:
// each try patches the pod as last read (the cache's first, then a fresh
// read after a failed test op), with exponential backoff after every
// failure (a 422 that is not a test op, an admission webhook's say, must
// not spin).
func (c *controller) record(ctx context.Context, pod *corev1.Pod, fn *v1alpha1.Function, info claimInfo) recordState {
	uid := pod.UID
	cur := pod
	backoff := doubling(recordBackoffBase, recordBackoffMax)
	for attempt := 1; ; attempt++ {
		switch st := recordStateOf(cur, uid, fn); st {
		case recordDone:
			return st
		case recordPodGone:
			c.log.Info("claimed pod gone before its record", "function", fn.Key(), "pod", pod.Namespace+"/"+pod.Name)
			return st
		case recordForeign:
			// The instance accepted fn, the pod says otherwise: nothing
			// here may overwrite it.
			c.log.Error("claimed pod recorded for another function", "function", fn.Key(), "pod", pod.Namespace+"/"+pod.Name,
				"labelled", cur.Labels[v1alpha1.LabelFunction])
			return st
		}
		err := c.recordOnce(ctx, cur, fn, info)
		if err == nil {
			if attempt > 1 {
				c.log.Info("claim recorded", "function", fn.Key(), "pod", pod.Name, "attempts", attempt)
			}
			return recordDone
		}
		c.metrics.recordFailures.Inc()
		if errors.Is(err, errClaimLost) {
			// A test op failed or the pod is gone: read it again and
			// decide, at once when the read settles it (gone, recorded,
			// another's), else after the backoff.
			gctx, cancel := context.WithTimeout(ctx, c.cfg.AssignTimeout)
			live, gerr := c.core.CoreV1().Pods(pod.Namespace).Get(gctx, pod.Name, metav1.GetOptions{})
			cancel()
			switch {
			case gerr == nil:
				cur = live
			case apierrors.IsNotFound(gerr):
				cur = nil
			default:
				err = errors.Join(err, gerr)
			}
			if gerr == nil || apierrors.IsNotFound(gerr) {
				if recordStateOf(cur, uid, fn) != recordNeeded {
					continue
				}
			}
		}
		in := backoff.Step()
		c.log.Warn("record of claim failed, retrying", "function", fn.Key(), "pod", pod.Name, "attempt", attempt, "in", in, "err", err)
		select {
		case <-ctx.Done():
			c.log.Warn("claim left unrecorded at shutdown (the next owner adopts it)", "function", fn.Key(), "pod", pod.Name)
			return recordNeeded
		case <-time.After(in):
		}
	}
}

// recordOnce applies the record patch to cur; errClaimLost when a test op
// failed or the pod is gone.
func (c *controller) recordOnce(ctx context.Context, cur *corev1.Pod, fn *v1alpha1.Function, info claimInfo) error {
	patch, err := recordPatch(cur, fn, info)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AssignTimeout)
	defer cancel()
	_, err = c.core.CoreV1().Pods(cur.Namespace).Patch(ctx, cur.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
	switch {
	case err == nil:
		return nil
	// A failed test op is 422 Invalid; a concurrent write can surface as 409;
	// a pod deleted since it was read is 404.
	// Forbidden: the admission policy (deploy/base/controller-admission.yaml)
	// refused a patch built from a stale read (a whole map replaced): read
	// again and decide anew, as for a failed test op.
	case apierrors.IsInvalid(err), apierrors.IsConflict(err), apierrors.IsNotFound(err), apierrors.IsForbidden(err):
		return fmt.Errorf("%w: record claim of pod %s/%s: %v", errClaimLost, cur.Namespace, cur.Name, err)
	}
	return fmt.Errorf("record claim of pod %s/%s: %w", cur.Namespace, cur.Name, err)
}

// RecordPatch is the JSON patch the record of a claim applies to pod, as
// last read, once its instance accepted fn at the time at (no restarts, no
// router, no callers): the label, the ownerReference, the annotations, and
// the test ops that make it fail (422 Invalid, a lost claim) when the pod's
// labels, owners or UID changed since the read. The controller builds it
// itself; it is exported for the tests that apply it to a real API server
// (tests/integration).
func RecordPatch(pod *corev1.Pod, fn *v1alpha1.Function, at time.Time) ([]byte, error) {
	return recordPatch(pod, fn, claimInfo{At: at})
}
