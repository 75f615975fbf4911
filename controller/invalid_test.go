package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

// addRaw stores a Function object as given, past any validation (as an
// object written straight to etcd, or under an older CRD, is served).
func (e *testEnv) addRaw(name string, spec map[string]any) {
	e.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(),
		"kind":       "Function",
		"metadata":   map[string]any{"namespace": "default", "name": name, "uid": "uid-" + name, "generation": int64(1)},
		"spec":       spec,
	}}
	if _, err := e.dyn.Resource(v1alpha1.Resource).Namespace("default").Create(e.t.Context(), u, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *testEnv) condition(name, typ string) map[string]any {
	e.t.Helper()
	conds, _ := e.functionStatus(name)["conditions"].([]any)
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			return m
		}
	}
	return nil
}

// TestInvalidFunctionDegradedNotFatal: Functions the controller cannot
// act on (one that does not convert, one whose counts are beyond their
// bounds) neither keep a replica from syncing nor are acted on: the
// replica turns Ready, serves its other Functions, answers
// FailedPrecondition for the invalid ones, and reports each as Degraded
// with a Warning Event; once fixed, Degraded goes back to False and the
// function is served.
func TestInvalidFunctionDegradedNotFatal(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.add(poolDeploy("echo"), e.fnFor("hello", "echo"), poolPod("p1", "echo"), poolPod("p2", "echo"))
	unparsable := map[string]any{"pool": "echo", "port": int64(e.assignPort), "maxInstances": int64(1), "idleTimeout": "5 minutes"}
	e.addRaw("unparsable", unparsable)
	e.addRaw("huge", map[string]any{"pool": "echo", "port": int64(e.assignPort), "minInstances": int64(2147483647), "maxInstances": int64(2147483647)})

	// startReplica waits for /readyz: the caches synced despite the bad objects.
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) {
		c.ScaleInterval, c.StatusInterval = 20*time.Millisecond, 10*time.Millisecond
	})
	if _, err := getInstance(t.Context(), r, "hello", nil); err != nil {
		t.Fatalf("GetInstance of the valid function: %v", err)
	}

	for name, field := range map[string]string{"unparsable": "spec.idleTimeout", "huge": "spec.minInstances"} {
		_, err := getInstance(t.Context(), r, name, nil)
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), field) {
			t.Errorf("GetInstance %s = %v %q, want FailedPrecondition naming %s", name, st.Code(), st.Message(), field)
		}
		poll.Until(t, pollTimeout, pollInterval, name+" Degraded", func(context.Context) error {
			c := e.condition(name, conditionDegraded)
			msg, _ := c["message"].(string)
			if c["status"] != "True" || c["reason"] != reasonInvalidSpec || !strings.Contains(msg, field) {
				return fmt.Errorf("condition %v", c)
			}
			return nil
		})
		poll.Until(t, pollTimeout, pollInterval, name+" InvalidSpec event", func(ctx context.Context) error {
			evs, err := e.core.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			for _, ev := range evs.Items {
				if ev.InvolvedObject.Name == name && ev.Type == corev1.EventTypeWarning && ev.Reason == reasonInvalidSpec &&
					strings.Contains(ev.Message, field) {
					return nil
				}
			}
			return fmt.Errorf("none among %d events", len(evs.Items))
		})
	}
	// Nothing was claimed for them: one instance (hello's), one pool pod left.
	if got := e.livePods("huge"); len(got) != 0 {
		t.Errorf("instances of the invalid function huge: %d", len(got))
	}
	if c := e.condition("hello", conditionDegraded); c != nil {
		t.Errorf("the valid function carries %v", c)
	}

	// Fixed: Degraded False, and the function is served.
	u, err := e.dyn.Resource(v1alpha1.Resource).Namespace("default").Get(t.Context(), "unparsable", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(u.Object, "5m", "spec", "idleTimeout"); err != nil {
		t.Fatal(err)
	}
	u.SetGeneration(2)
	if _, err := e.dyn.Resource(v1alpha1.Resource).Namespace("default").Update(t.Context(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, pollInterval, "unparsable no longer Degraded", func(context.Context) error {
		if c := e.condition("unparsable", conditionDegraded); c["status"] != "False" || c["reason"] != reasonSpecValid {
			return fmt.Errorf("condition %v", c)
		}
		return nil
	})
	if _, err := getInstance(t.Context(), r, "unparsable", nil); err != nil {
		t.Errorf("GetInstance of the fixed function: %v", err)
	}
}
