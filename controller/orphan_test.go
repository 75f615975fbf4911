package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

func TestOrphaned(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	labelled := func(p *corev1.Pod) { p.Labels[v1alpha1.LabelFunction] = "hello" }
	noOwners := func(p *corev1.Pod) { p.OwnerReferences = nil }
	otherKind := func(p *corev1.Pod) {
		p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{APIVersion: "example.com/v1", Kind: "Function", Name: "hello", UID: "x"})
	}
	pods := []*corev1.Pod{
		testPod("pool"),                    // a warm pool pod: no label
		testPod("instance", claimedBy(fn)), // a live instance
		testPod("instance-rs-released", claimedBy(fn), func(p *corev1.Pod) { p.OwnerReferences = p.OwnerReferences[1:] }),
		testPod("stripped", labelled),                    // the ReplicaSet's ref left, the Function's stripped
		testPod("stripped-released", labelled, noOwners), // and then released by the ReplicaSet
		testPod("foreign-owner", labelled, noOwners, otherKind),
		testPod("terminating", labelled, noOwners, terminating),
	}
	var got []string
	for _, p := range orphaned(pods) {
		got = append(got, p.Name)
	}
	want := []string{"stripped", "stripped-released", "foreign-owner"}
	if len(got) != len(want) {
		t.Fatalf("orphaned = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("orphaned = %v, want %v", got, want)
		}
	}
}

// TestOrphanedInstanceDeleted: a pod labelled for a deleted Function and
// owned by nothing (what the garbage collector leaves when a Function is
// deleted right after a claim) is deleted by the owning replica, and a
// live instance of another Function is left alone.
func TestOrphanedInstanceDeleted(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("hello", "echo")
	e.add(poolDeploy("echo"), fn)
	e.add(poolPod("live", "echo", claimedBy(fn)))
	e.add(poolPod("orphan", "echo", func(p *corev1.Pod) {
		p.Labels[v1alpha1.LabelFunction] = "gone"
		p.OwnerReferences = nil
	}))
	startReplica(t, e, "ctl-0", nil, nil)
	poll.Until(t, pollTimeout, pollInterval, "orphaned instance deleted", func(ctx context.Context) error { return podGone(ctx, e, "orphan") })
	if _, err := e.core.CoreV1().Pods("default").Get(t.Context(), "live", metav1.GetOptions{}); err != nil {
		t.Errorf("live instance: %v", err)
	}
}
