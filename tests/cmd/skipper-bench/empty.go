package main

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// emptier runs each cold call against an empty pool: no warm pod, so the
// call waits for the pool's ReplicaSet to start one.
type emptier struct {
	cs       kubernetes.Interface
	ns, pool string
	deploy   string
	replicas int32 // to restore
}

func newEmptier(ctx context.Context, cs kubernetes.Interface, ns, pool string) (*emptier, error) {
	ds, err := cs.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + pool})
	if err != nil {
		return nil, fmt.Errorf("pool deployment: %w", err)
	}
	if len(ds.Items) != 1 {
		return nil, fmt.Errorf("pool %s/%s: %d Deployments labelled %s=%s, want 1", ns, pool, len(ds.Items), v1alpha1.LabelPool, pool)
	}
	d := ds.Items[0]
	r := int32(1)
	if d.Spec.Replicas != nil {
		r = *d.Spec.Replicas
	}
	return &emptier{cs: cs, ns: ns, pool: pool, deploy: d.Name, replicas: r}, nil
}

func (e *emptier) scale(ctx context.Context, n int32) error {
	patch := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, n)
	_, err := e.cs.AppsV1().Deployments(e.ns).Patch(ctx, e.deploy, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("scale pool %s/%s to %d: %w", e.ns, e.deploy, n, err)
	}
	return nil
}

// call empties the pool, then makes the call and scales the pool to 1 at
// the same moment, and returns the call's latency.
func (e *emptier) call(ctx context.Context, do func() (time.Duration, error), timeout time.Duration) (time.Duration, error) {
	if err := e.scale(ctx, 0); err != nil {
		return 0, err
	}
	sel := v1alpha1.LabelPool + "=" + e.pool + ",!" + v1alpha1.LabelFunction
	deadline := time.Now().Add(timeout)
	for {
		pods, err := e.cs.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err == nil && len(pods.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("pool %s/%s still has warm pods after %s", e.ns, e.pool, timeout)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	type result struct {
		d   time.Duration
		err error
	}
	done := make(chan result, 1)
	go func() { d, err := do(); done <- result{d, err} }()
	if err := e.scale(ctx, 1); err != nil {
		<-done
		return 0, err
	}
	r := <-done
	return r.d, r.err
}

// restore gives the pool back its replica count.
func (e *emptier) restore() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = e.scale(ctx, e.replicas)
}
