package controller

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// TestStatusPatchDegraded: an invalid Function's status says Degraded
// (and nothing about counts it no longer has); once fixed, Degraded goes
// back to False; a Function never invalid carries no Degraded condition.
func TestStatusPatchDegraded(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0.Add(time.Minute)
	cond := func(typ string, st metav1.ConditionStatus, reason, msg string, at time.Time) metav1.Condition {
		return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: 2, LastTransitionTime: metav1.NewTime(at)}
	}
	ready := cond(conditionReady, metav1.ConditionTrue, "InstancesReady", "1 of 1 desired instances ready", t0)
	pool := cond(conditionPoolAvailable, metav1.ConditionTrue, "PoolAvailable", "the pool has ready pods to claim", t0)
	const msg = `spec.idleTimeout: time: unknown unit " minutes" in duration "5 minutes"`
	degraded := cond(conditionDegraded, metav1.ConditionTrue, reasonInvalidSpec, msg, t0)
	fn := func(conds ...metav1.Condition) *v1alpha1.Function {
		return &v1alpha1.Function{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", Generation: 2},
			Status: v1alpha1.FunctionStatus{
				ObservedGeneration: 2, Desired: 1, Ready: 1, Owner: "ctl-0", Conditions: conds,
			},
		}
	}
	healthy := statusView{desired: 1, ready: 1}
	tests := []struct {
		name string
		fn   *v1alpha1.Function
		v    statusView
		want map[string]any
	}{
		{name: "never invalid: no Degraded", fn: fn(ready, pool), v: healthy},
		{name: "turns invalid: Degraded True, counts and conditions kept", fn: fn(ready, pool), v: statusView{invalid: msg},
			want: map[string]any{"conditions": []metav1.Condition{ready, pool, cond(conditionDegraded, metav1.ConditionTrue, reasonInvalidSpec, msg, now)}}},
		{name: "still invalid: nothing to write", fn: fn(ready, pool, degraded), v: statusView{invalid: msg}},
		{name: "invalid for another reason: message updated, transition kept", fn: fn(ready, pool, degraded), v: statusView{invalid: "spec.port: -1 is outside 0..65535"},
			want: map[string]any{"conditions": []metav1.Condition{ready, pool, cond(conditionDegraded, metav1.ConditionTrue, reasonInvalidSpec, "spec.port: -1 is outside 0..65535", t0)}}},
		{name: "fixed: Degraded False", fn: fn(ready, pool, degraded), v: healthy,
			want: map[string]any{"conditions": []metav1.Condition{ready, pool, cond(conditionDegraded, metav1.ConditionFalse, reasonSpecValid, "the spec is valid", now)}}},
		{name: "fixed long ago: nothing to write", fn: fn(ready, pool, cond(conditionDegraded, metav1.ConditionFalse, reasonSpecValid, "the spec is valid", t0)), v: healthy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := statusPatch(tt.fn, "ctl-0", tt.v, now)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("statusPatch (-want +got):\n%s", diff)
			}
		})
	}
}
