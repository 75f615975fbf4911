package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// Function condition types.
const (
	// conditionReady is True when as many instances are ready as desired.
	conditionReady = "Ready"
	// conditionPoolAvailable is False when the pool is missing or the last
	// claim found it empty.
	conditionPoolAvailable = "PoolAvailable"
)

// statusView is what the owner reports in a Function's status.
type statusView struct {
	desired, ready int32
	reason         string
	lastScale      time.Time
	// exhausted is why the last claim found no pool pod ("" if it did).
	exhausted string
	// poolErr is why the pool cannot be used (nil if it can).
	poolErr error
}

// statusPatch returns the merge patch that brings fn's status to v, or nil
// when the status already says it. Conditions keep their transition times
// while their status holds.
func statusPatch(fn *v1alpha1.Function, owner string, v statusView, now time.Time) map[string]any {
	s := fn.Status
	conds := append([]metav1.Condition(nil), s.Conditions...)
	changed := false
	set := func(typ string, ok bool, reason, msg string) {
		st := metav1.ConditionFalse
		if ok {
			st = metav1.ConditionTrue
		}
		if meta.SetStatusCondition(&conds, metav1.Condition{
			Type: typ, Status: st, Reason: reason, Message: msg,
			ObservedGeneration: fn.Generation, LastTransitionTime: metav1.NewTime(now),
		}) {
			changed = true
		}
	}
	if v.ready >= v.desired {
		set(conditionReady, true, "InstancesReady", fmt.Sprintf("%d of %d desired instances ready", v.ready, v.desired))
	} else {
		set(conditionReady, false, "InstancesNotReady", fmt.Sprintf("%d of %d desired instances ready", v.ready, v.desired))
	}
	switch {
	case v.poolErr != nil:
		set(conditionPoolAvailable, false, "PoolNotFound", v.poolErr.Error())
	case v.exhausted != "":
		set(conditionPoolAvailable, false, "PoolExhausted", v.exhausted)
	default:
		set(conditionPoolAvailable, true, "PoolAvailable", "the pool has ready pods to claim")
	}
	out := map[string]any{}
	if changed {
		out["conditions"] = conds
	}
	if s.Owner != owner {
		out["owner"] = owner
	}
	if s.Ready != v.ready {
		out["ready"] = v.ready
	}
	if s.Desired != v.desired {
		out["desired"] = v.desired
	}
	if v.reason != "" && s.LastScaleReason != v.reason {
		out["lastScaleReason"] = v.reason
	}
	if !v.lastScale.IsZero() && (s.LastScaleTime == nil || !s.LastScaleTime.Time.Equal(v.lastScale.Truncate(time.Second))) {
		out["lastScaleTime"] = metav1.NewTime(v.lastScale)
	}
	if s.ObservedGeneration != fn.Generation {
		out["observedGeneration"] = fn.Generation
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// writeStatus patches fn's /status to v when it differs from the cached
// status, at most once per --status-interval per function; a write held
// back is retried by the next tick or sync, which computes it afresh.
func (c *controller) writeStatus(ctx context.Context, fn *v1alpha1.Function, v statusView, now time.Time) error {
	st := statusPatch(fn, c.cfg.PodName, v, now)
	if st == nil {
		return nil
	}
	key := fn.Key()
	c.mu.Lock()
	if last, ok := c.statusAt[key]; ok && now.Sub(last) < c.cfg.StatusInterval {
		c.mu.Unlock()
		c.fnQueue.AddAfter(key, c.cfg.StatusInterval-now.Sub(last))
		return nil
	}
	c.statusAt[key] = now
	c.mu.Unlock()
	patch, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		return err
	}
	_, err = c.dyn.Resource(v1alpha1.Resource).Namespace(fn.Namespace).
		Patch(ctx, fn.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("patch status of %s: %w", key, err)
	}
	return nil
}
