package e2e

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

func call(t *testing.T, function, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, env.routerURL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if function != "" {
		req.Header.Set("x-skipper-function", function)
	}
	c := http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s (%s): %v", path, function, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestSkeleton is issue 2's flow: a call travels caller → router →
// controller → a claimed pool pod, the pool refills, and the warm call asks
// the controller nothing.
func TestSkeleton(t *testing.T) {
	ctx := context.Background()
	getInstance := func() float64 {
		return metricSum(t, env.routerMetrics, "skipper_noderouter_get_instance_total", nil)
	}

	code, body := call(t, "default/echo", "/hello")
	if code != http.StatusOK {
		t.Fatalf("first call: %d %s", code, body)
	}
	if !strings.Contains(body, "default/echo") || !strings.Contains(body, "/hello") {
		t.Fatalf("first call body does not come from the echo instance assigned to default/echo: %s", body)
	}

	fn, err := env.dyn.Resource(v1alpha1.Resource).Namespace("default").Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Function default/echo: %v", err)
	}
	claimed, err := env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=echo"})
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed.Items) == 0 {
		t.Fatal("no pod carries skipper.dev/function=echo")
	}
	for _, p := range claimed.Items {
		if !ownedBy(p, fn) {
			t.Errorf("claimed pod %s is not owned by Function echo (uid %s): %+v", p.Name, fn.GetUID(), p.OwnerReferences)
		}
		if p.Labels[v1alpha1.LabelPool] != "echo" {
			t.Errorf("claimed pod %s lost its pool label: %v", p.Name, p.Labels)
		}
	}

	// The ReplicaSet released the claimed pod and keeps three warm ones.
	sel := labels.SelectorFromSet(labels.Set{v1alpha1.LabelPool: "echo"}).String() + "," + "!" + v1alpha1.LabelFunction
	poll.Until(t, 60*time.Second, pollInterval, "pool refilled to 3 ready pods", func(ctx context.Context) error {
		pods, err := env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return err
		}
		ready := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && podReady(p) {
				ready++
			}
		}
		if ready < 3 {
			return fmt.Errorf("%d of 3 warm pods ready", ready)
		}
		return nil
	})

	// Warm traffic asks nothing only once ownership is settled: while the
	// controllers' ring still grows (just after make up) the owner may move
	// and the router re-fetches. Wait for every replica to see all members,
	// fill the cache once, then measure.
	poll.Until(t, 60*time.Second, pollInterval, "every controller sees the whole ring", func(context.Context) error {
		urls := controllerMetricsURLs(t)
		for _, u := range urls {
			if got := metricSum(t, u, "skipper_controller_ring_members", nil); int(got) != len(urls) {
				return fmt.Errorf("%s sees %v ring members, want %d", u, got, len(urls))
			}
		}
		return nil
	})
	if code, body := call(t, "default/echo", "/settle"); code != http.StatusOK {
		t.Fatalf("settling call: %d %s", code, body)
	}
	before := getInstance()
	for i := range 5 {
		if code, body := call(t, "default/echo", fmt.Sprintf("/warm/%d", i)); code != http.StatusOK {
			t.Fatalf("warm call %d: %d %s", i, code, body)
		}
	}
	if after := getInstance(); after != before {
		t.Fatalf("warm calls made %v GetInstance calls, want 0", after-before)
	}
}

func TestRouterErrors(t *testing.T) {
	tests := []struct {
		name     string
		function string
		want     int
	}{
		{name: "missing name", function: "", want: http.StatusBadRequest},
		{name: "malformed name", function: "default/Not_A_Name", want: http.StatusBadRequest},
		{name: "unknown function", function: "default/no-such-function", want: http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := call(t, tt.function, "/x")
			if code != tt.want {
				t.Fatalf("status %d, want %d (%s)", code, tt.want, body)
			}
			if !strings.Contains(body, `"error"`) {
				t.Fatalf("body is not a JSON error: %s", body)
			}
		})
	}
}

func TestInvalidFunctionRejected(t *testing.T) {
	tests := []struct {
		name    string
		spec    map[string]any
		message string
		fnName  string // default invalid-<i>
	}{
		{name: "min above max", spec: map[string]any{"pool": "echo", "minInstances": int64(3), "maxInstances": int64(2)}, message: "minInstances must not exceed maxInstances"},
		{name: "negative", spec: map[string]any{"pool": "echo", "maxInstances": int64(1), "concurrencyLimit": int64(-1)}, message: "concurrencyLimit"},
		{name: "pool not a DNS label", spec: map[string]any{"pool": "Echo_Pool", "maxInstances": int64(1)}, message: "spec.pool"},
		{name: "max missing", spec: map[string]any{"pool": "echo"}, message: "maxInstances"},
		// Issue 13's two inputs that stopped the control plane.
		{name: "counts unbounded", spec: map[string]any{"pool": "echo", "minInstances": int64(2147483647), "maxInstances": int64(2147483647)}, message: "maxInstances"},
		{name: "idleTimeout not a duration", spec: map[string]any{"pool": "echo", "maxInstances": int64(1), "idleTimeout": "5 minutes"}, message: "idleTimeout"},
		{name: "name not a DNS label", spec: map[string]any{"pool": "echo", "maxInstances": int64(1)}, message: "name", fnName: "dotted.name"},
		{name: "name not a Service name", spec: map[string]any{"pool": "echo", "maxInstances": int64(1)}, message: "Service name", fnName: "1st"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1alpha1.SchemeGroupVersion.String(),
				"kind":       "Function",
				"metadata":   map[string]any{"name": cmp.Or(tt.fnName, fmt.Sprintf("invalid-%d", i)), "namespace": "default"},
				"spec":       tt.spec,
			}}
			_, err := env.dyn.Resource(v1alpha1.Resource).Namespace("default").Create(context.Background(), obj, metav1.CreateOptions{})
			if err == nil {
				t.Fatal("API server accepted an invalid Function")
			}
			if !strings.Contains(err.Error(), tt.message) {
				t.Fatalf("error %q does not mention %q", err, tt.message)
			}
		})
	}
}

func ownedBy(p corev1.Pod, fn *unstructured.Unstructured) bool {
	for _, o := range p.OwnerReferences {
		if o.UID == fn.GetUID() && o.Kind == "Function" && o.Name == fn.GetName() {
			return true
		}
	}
	return false
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
