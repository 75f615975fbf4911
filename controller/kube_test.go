package controller

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

func TestToFunction(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "skipper.dev/v1alpha1",
		"kind":       "Function",
		"metadata": map[string]any{
			"namespace": "default", "name": "echo", "uid": "u1",
			"managedFields": []any{map[string]any{"manager": "kubectl"}},
		},
		"spec": map[string]any{
			"pool": "echo", "maxInstances": int64(10), "idleTimeout": "5m", "timeout": "2s",
			"concurrencyLimit": int64(4), "config": map[string]any{"k": "v"},
			"scaling": map[string]any{"targetInFlight": int64(3)},
		},
		"status": map[string]any{"owner": "ctl-0", "ready": int64(1)},
	}}
	got, err := toFunction(u)
	if err != nil {
		t.Fatal(err)
	}
	fn := got.(*v1alpha1.Function)
	want := v1alpha1.FunctionSpec{
		Pool: "echo", MaxInstances: 10, ConcurrencyLimit: 4, Config: map[string]string{"k": "v"},
		IdleTimeout: &metav1.Duration{Duration: 5 * time.Minute}, Timeout: &metav1.Duration{Duration: 2 * time.Second},
		Scaling: v1alpha1.Scaling{TargetInFlight: 3},
	}
	if diff := cmp.Diff(want, fn.Spec); diff != "" {
		t.Errorf("spec (-want +got):\n%s", diff)
	}
	if fn.Key() != "default/echo" || fn.UID != "u1" || fn.Status.Owner != "ctl-0" || fn.ManagedFields != nil {
		t.Errorf("function = %+v", fn)
	}

	// Tombstones are converted inside.
	ts, err := toFunction(cache.DeletedFinalStateUnknown{Key: "default/echo", Obj: u})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tombstone(ts).(*v1alpha1.Function); !ok {
		t.Errorf("tombstone holds %T", tombstone(ts))
	}

	// A malformed object is an error, not a panic.
	bad := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"maxInstances": "many"}}}
	if _, err := toFunction(bad); err == nil {
		t.Error("malformed Function converted without error")
	}
}
