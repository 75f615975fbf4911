package controller

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

func TestToFunction(t *testing.T) {
	t.Parallel()
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

	// A malformed object is kept as an invalid Function, never an error.
	bad := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"maxInstances": "many"}}}
	got, err = toFunction(bad)
	if err != nil {
		t.Fatalf("toFunction of a malformed object: %v", err)
	}
	if _, ok := got.(*invalidFunction); !ok {
		t.Errorf("malformed object cached as %T, want *invalidFunction", got)
	}
}

// TestToFunctionInvalid: objects the controller cannot act on enter the
// cache as invalid Functions that keep their identity and name the field
// at fault; the transform never fails (a failing transform aborts the
// informer's whole list).
func TestToFunctionInvalid(t *testing.T) {
	t.Parallel()
	obj := func(spec any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "skipper.dev/v1alpha1",
			"kind":       "Function",
			"metadata": map[string]any{
				"namespace": "default", "name": "bad", "uid": "u1", "generation": int64(3), "resourceVersion": "7",
			},
			"spec":   spec,
			"status": map[string]any{"owner": "ctl-0", "conditions": []any{map[string]any{"type": "Ready", "status": "True"}}},
		}}
	}
	valid := func(kv ...any) map[string]any {
		m := map[string]any{"pool": "echo", "maxInstances": int64(2)}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name string
		obj  *unstructured.Unstructured
		want []string // substrings of the error, in order
	}{
		{name: "idleTimeout not a duration", obj: obj(valid("idleTimeout", "5 minutes")), want: []string{"spec.idleTimeout: ", `"5 minutes"`}},
		{name: "timeout not a string", obj: obj(valid("timeout", int64(5))), want: []string{"spec.timeout: "}},
		{name: "count of the wrong type", obj: obj(valid("maxInstances", "many")), want: []string{"spec.maxInstances: "}},
		{name: "fractional count", obj: obj(valid("minInstances", 1.5)), want: []string{"spec.minInstances: "}},
		{name: "nested field", obj: obj(valid("scaling", map[string]any{"targetInFlight": "x", "targetCPUMilli": int64(100)})), want: []string{"spec.scaling.targetInFlight: "}},
		{name: "config value not a string", obj: obj(valid("config", map[string]any{"a": "ok", "b": int64(1)})), want: []string{"spec.config.b: "}},
		{name: "two bad fields, both named", obj: obj(valid("idleTimeout", "soon", "port", "http")), want: []string{"spec.idleTimeout: ", "spec.port: "}},
		{name: "spec not an object", obj: obj("x"), want: []string{"spec: "}},
		{name: "spec missing", obj: obj(nil), want: []string{"spec.pool: ", "spec.maxInstances: 0 is outside 1..1000"}},
		{name: "minInstances beyond its bound", obj: obj(valid("minInstances", int64(2147483647), "maxInstances", int64(2147483647))), want: []string{"spec.minInstances: 2147483647 is outside 0..1000", "spec.maxInstances: 2147483647 is outside 1..1000"}},
		{name: "count wrapping int32", obj: obj(valid("maxInstances", int64(1)<<32+1)), want: []string{"spec.maxInstances: 4294967297 does not fit in 32 bits"}},
		{name: "negative duration", obj: obj(valid("idleTimeout", "-5s")), want: []string{"spec.idleTimeout: -5s is outside 1s..24h0m0s"}},
		{name: "min above max", obj: obj(valid("minInstances", int64(3))), want: []string{"spec.minInstances: 3 exceeds spec.maxInstances 2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := toFunction(tt.obj)
			if err != nil {
				t.Fatalf("toFunction: %v", err)
			}
			inv, ok := got.(*invalidFunction)
			if !ok {
				t.Fatalf("cached as %T, want *invalidFunction", got)
			}
			msg := inv.err.Error()
			rest := msg
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error %q does not name %q (in order %q)", msg, w, tt.want)
				}
				rest = rest[i+len(w):]
			}
			wantMeta := metav1.ObjectMeta{Namespace: "default", Name: "bad", UID: "u1", Generation: 3, ResourceVersion: "7"}
			if diff := cmp.Diff(wantMeta, inv.fn.ObjectMeta); diff != "" {
				t.Errorf("metadata (-want +got):\n%s", diff)
			}
			if inv.fn.Status.Owner != "ctl-0" || len(inv.fn.Status.Conditions) != 1 {
				t.Errorf("status not kept: %+v", inv.fn.Status)
			}
			// The cache's key and namespace index see through it.
			if k, err := cache.MetaNamespaceKeyFunc(got); err != nil || k != "default/bad" {
				t.Errorf("cache key = %q, %v", k, err)
			}
			if ns, err := cache.MetaNamespaceIndexFunc(got); err != nil || len(ns) != 1 || ns[0] != "default" {
				t.Errorf("namespace index = %q, %v", ns, err)
			}
			// Tombstones too.
			ts, err := toFunction(cache.DeletedFinalStateUnknown{Key: "default/bad", Obj: tt.obj})
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := tombstone(ts).(*invalidFunction); !ok {
				t.Errorf("tombstone holds %T", tombstone(ts))
			}
		})
	}
}

// TestToFunctionMetadataFallback: metadata the converter refuses still
// gives the cache a key.
func TestToFunctionMetadataFallback(t *testing.T) {
	t.Parallel()
	u := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"namespace": "default", "name": "odd", "uid": "u2", "labels": "not-a-map"},
		"spec":     map[string]any{"pool": "echo", "maxInstances": int64(1)},
	}}
	got, err := toFunction(u)
	if err != nil {
		t.Fatal(err)
	}
	inv, ok := got.(*invalidFunction)
	if !ok {
		t.Fatalf("cached as %T, want *invalidFunction", got)
	}
	if inv.fn.Key() != "default/odd" || inv.fn.UID != "u2" || !strings.Contains(inv.err.Error(), "metadata.labels: ") {
		t.Errorf("invalid function %s uid %s err %v", inv.fn.Key(), inv.fn.UID, inv.err)
	}
}

// TestInformersUseTheWatchClients: the informers list and watch through the
// watch clients (Run gives them a dial that waits out refusals) and nothing
// else does; direct calls keep the plain clients, so a call on a request's
// path fails at once during an outage. Without watch clients, the informers
// take the plain ones (tests pass fakes).
func TestInformersUseTheWatchClients(t *testing.T) {
	t.Parallel()
	newDyn := func() *dynamicfake.FakeDynamicClient {
		return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(kruntime.NewScheme(),
			map[schema.GroupVersionResource]string{v1alpha1.Resource: "FunctionList"})
	}
	direct, watch := fake.NewClientset(), fake.NewClientset(poolPod("echo-1", "echo"))
	directDyn, watchDyn := newDyn(), newDyn()
	cl := clients{core: direct, dyn: directDyn, watchCore: watch, watchDyn: watchDyn}
	c, err := newController(validConfig(), "127.0.0.1:9090", slog.New(slog.NewTextHandler(io.Discard, nil)), cl, newTestAssignKey(t), newMetrics())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.shutDownQueues)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	c.cache.run(ctx, &wg)
	if !c.cache.waitSynced(ctx) {
		t.Fatal("cache not synced")
	}
	if _, ok, _ := c.cache.set("default").pods.GetIndexer().GetByKey("default/echo-1"); !ok {
		t.Error("the pod the watch clientset holds is not in the cache")
	}
	if c.core != kubernetes.Interface(direct) || c.dyn != dynamic.Interface(directDyn) {
		t.Error("direct calls do not go through the plain clients")
	}
	if n := len(direct.Actions()) + len(directDyn.Actions()); n != 0 {
		t.Errorf("the plain clients served %d informer actions, want 0: %v", n, direct.Actions())
	}
	if len(watch.Actions()) == 0 || len(watchDyn.Actions()) == 0 {
		t.Errorf("the watch clients served %d and %d actions, want some", len(watch.Actions()), len(watchDyn.Actions()))
	}

	gotCore, gotDyn := clients{core: direct, dyn: directDyn}.watch()
	if gotCore != kubernetes.Interface(direct) || gotDyn != dynamic.Interface(directDyn) {
		t.Error("without watch clients, the informers do not take the plain ones")
	}
}
