package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

// TestOrphanedInstanceDeleted: a pod labelled as an instance of a Function
// that does not exist, and owned by nothing, is deleted by the controllers.
// The garbage collector leaves such pods when a Function is deleted right
// after a claim (it strips the Function's reference from a pod it still
// sees owned by the ReplicaSet, whose release then follows); before the
// controllers swept them, they ran for ever.
func TestOrphanedInstanceDeleted(t *testing.T) {
	p := echoPod("orphan-e2e", "node1", map[string]string{
		v1alpha1.LabelPool:     "orphans-e2e",
		v1alpha1.LabelFunction: "no-such-function",
	})
	api := env.kube.CoreV1().Pods("default")
	_ = api.Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	poll.Until(t, 30*time.Second, pollInterval, "leftover pod gone", func(ctx context.Context) error {
		if _, err := api.Get(ctx, p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	// Not createPods: the pod need not become Ready before it is swept.
	created, err := api.Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = api.Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})
	start := time.Now()
	poll.Until(t, 30*time.Second, pollInterval, "orphaned instance deleted", func(ctx context.Context) error {
		got, err := api.Get(ctx, p.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		case got.UID != created.UID, got.DeletionTimestamp != nil:
			return nil
		}
		return fmt.Errorf("pod %s still running", p.Name)
	})
	t.Logf("orphaned instance deleted %s after its creation", time.Since(start).Round(10*time.Millisecond))
}
