package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
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
	// conditionDegraded is True (reason InvalidSpec) while the stored
	// object is one the controller cannot act on, and False once it is
	// fixed; a Function never invalid does not carry it.
	conditionDegraded = "Degraded"
)

// Reasons of condition Degraded; reasonInvalidSpec is also the Warning
// Event's reason.
const (
	reasonInvalidSpec = "InvalidSpec"
	reasonSpecValid   = "SpecValid"
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
	// service is what the owner last found of the Function's own Service
	// (nil: nothing yet, or no Services: ServiceReady is left as it is).
	service *serviceState
	// invalid is why the Function cannot be acted on ("" if it can): the
	// status then reports Degraded and nothing else, the counts and the
	// other conditions staying as they were.
	invalid string
}

// degradedSays reports whether fn's status already says it is Degraded
// for msg.
func degradedSays(fn *v1alpha1.Function, msg string) bool {
	c := meta.FindStatusCondition(fn.Status.Conditions, conditionDegraded)
	return c != nil && c.Status == metav1.ConditionTrue && c.Reason == reasonInvalidSpec && c.Message == msg
}

// statusPatch returns the merge patch that brings fn's status to v, or nil
// when the status already says it. Conditions keep their transition times
// while their status holds. For an invalid Function (v.invalid set) it
// writes condition Degraded, the owner and the observed generation only.
func statusPatch(fn *v1alpha1.Function, owner string, v statusView, now time.Time) map[string]any {
	s := fn.Status
	type cond struct {
		typ, reason, msg string
		ok               bool
	}
	var want []cond
	if v.invalid != "" {
		want = []cond{{conditionDegraded, reasonInvalidSpec, v.invalid, true}}
	} else {
		counts := strconv.Itoa(int(v.ready)) + " of " + strconv.Itoa(int(v.desired)) + " desired instances ready"
		if v.ready >= v.desired {
			want = append(want, cond{conditionReady, "InstancesReady", counts, true})
		} else {
			want = append(want, cond{conditionReady, "InstancesNotReady", counts, false})
		}
		switch {
		case v.poolErr != nil:
			want = append(want, cond{conditionPoolAvailable, "PoolNotFound", v.poolErr.Error(), false})
		case v.exhausted != "":
			want = append(want, cond{conditionPoolAvailable, "PoolExhausted", v.exhausted, false})
		default:
			want = append(want, cond{conditionPoolAvailable, "PoolAvailable", "the pool has ready pods to claim", true})
		}
		if sv := v.service; sv != nil && sv.ok {
			want = append(want, cond{conditionServiceReady, reasonServiceReady,
				"callers reach it at http://" + fn.Name + "." + fn.Namespace + ".svc (an ExternalName Service of the routers')", true})
		} else if sv != nil {
			want = append(want, cond{conditionServiceReady, sv.reason, sv.msg, false})
		}
		if meta.FindStatusCondition(s.Conditions, conditionDegraded) != nil {
			// Fixed: Degraded goes back to False (a Function never
			// invalid does not carry it).
			want = append(want, cond{conditionDegraded, reasonSpecValid, "the spec is valid", false})
		}
	}
	out := map[string]any{}
	var conds []metav1.Condition
	for _, w := range want {
		st := metav1.ConditionFalse
		if w.ok {
			st = metav1.ConditionTrue
		}
		if c := meta.FindStatusCondition(s.Conditions, w.typ); c != nil && c.Status == st && c.Reason == w.reason &&
			c.Message == w.msg && c.ObservedGeneration == fn.Generation {
			continue
		}
		if conds == nil {
			conds = append([]metav1.Condition(nil), s.Conditions...)
		}
		meta.SetStatusCondition(&conds, metav1.Condition{
			Type: w.typ, Status: st, Reason: w.reason, Message: w.msg,
			ObservedGeneration: fn.Generation, LastTransitionTime: metav1.NewTime(now),
		})
	}
	if conds != nil {
		out["conditions"] = conds
	}
	if s.Owner != owner {
		out["owner"] = owner
	}
	if v.invalid == "" {
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
	v.service = c.serviceStateOf(fn.Key())
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
