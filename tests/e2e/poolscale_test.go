package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

// TestPoolAutoscales: a pool annotated skipper.dev/autoscale grows when
// new Functions claim its pods faster than it refills, says why in an
// Event, and shrinks back to its minimum once the claims leave its window
// (issue 15, item 6).
func TestPoolAutoscales(t *testing.T) {
	const pool, n = "autoscaled", 6
	createPool(t, pool, 1)
	ann := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true","skipper.dev/pool-min":"1","skipper.dev/pool-max":"8","skipper.dev/pool-window":"3s"}}}`,
		v1alpha1.AnnotationAutoscale)
	if _, err := env.kube.AppsV1().Deployments("default").Patch(t.Context(), pool, types.MergePatchType, []byte(ann), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 60*time.Second, pollInterval, "the pool's one pod ready", func(ctx context.Context) error {
		return poolReady(ctx, pool, 1)
	})
	// Events of this Deployment only: an earlier run's, of the same name,
	// stay for an hour.
	dep, err := env.kube.AppsV1().Deployments("default").Get(t.Context(), pool, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := range n {
		name := fmt.Sprintf("autoscaled-%d", i)
		createFunction(t, name, map[string]any{"pool": pool, "maxInstances": int64(1), "idleTimeout": "5m"})
		names = append(names, name)
	}
	// Every Function's first call at once: one pod is ready, the rest
	// wait for the pool to grow.
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Go(func() { firstCall(t, "default/"+name) })
	}
	wg.Wait()

	scaled := func(ctx context.Context) (up, down bool, err error) {
		evs, err := env.kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Deployment,involvedObject.name=" + pool + ",involvedObject.uid=" + string(dep.UID)})
		if err != nil {
			return false, false, err
		}
		for _, ev := range evs.Items {
			if ev.Reason != "PoolScaled" || ev.Type != corev1.EventTypeNormal {
				continue
			}
			var from, to int
			if _, err := fmt.Sscanf(ev.Message, "replicas %d → %d", &from, &to); err == nil {
				up, down = up || to > from, down || to < from
			}
		}
		return up, down, nil
	}
	poll.Until(t, 30*time.Second, pollInterval, "an Event says the pool grew", func(ctx context.Context) error {
		if up, _, err := scaled(ctx); err != nil || !up {
			return fmt.Errorf("no PoolScaled Event going up (%v)", err)
		}
		return nil
	})
	poll.Until(t, 60*time.Second, pollInterval, "the pool back at its minimum after the window", func(ctx context.Context) error {
		d, err := env.kube.AppsV1().Deployments("default").Get(ctx, pool, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, down, err := scaled(ctx); err != nil || !down || d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
			return fmt.Errorf("replicas %v, shrunk %v (%v)", d.Spec.Replicas, down, err)
		}
		return nil
	})
	// The instances are the Functions', one each, none lost to the
	// scale-down.
	for _, name := range names {
		if got := instances(t, name); got != 1 {
			t.Errorf("%s has %d instances after the scale-down, want 1", name, got)
		}
	}
}

// poolReady reports whether pool has want ready, unclaimed pods.
func poolReady(ctx context.Context, pool string, want int) error {
	pods, err := env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{
		LabelSelector: v1alpha1.LabelPool + "=" + pool + ",!" + v1alpha1.LabelFunction})
	if err != nil {
		return err
	}
	n := 0
	for _, p := range pods.Items {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
				n++
			}
		}
	}
	if n < want {
		return fmt.Errorf("%d of %d ready", n, want)
	}
	return nil
}
