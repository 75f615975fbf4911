package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

// routersName is what a Function's own Service names: the routers' Service
// in the local cluster's domain.
const routersName = "skipper.skipper-system.svc.cluster.local"

// functionCondition returns condition typ of Function default/name (nil:
// none yet).
func functionCondition(ctx context.Context, name, typ string) (*metav1.Condition, error) {
	u, err := env.dyn.Resource(v1alpha1.Resource).Namespace("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	raw, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	var conds []metav1.Condition
	for _, r := range raw {
		var c metav1.Condition
		if m, ok := r.(map[string]any); ok && runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c) == nil {
			conds = append(conds, c)
		}
	}
	return meta.FindStatusCondition(conds, typ), nil
}

// TestCalledByName: a Function gets an ExternalName Service of its own
// name, owned by it, naming the routers' Service; a pod on node 2 calls
// the function by that name (the cluster DNS, the Service VIP steered to
// its node's router, the router reading the Host) in the full, the .svc
// and the short form, with no header.
func TestCalledByName(t *testing.T) {
	const name = "byname"
	createFunction(t, name, nil)
	svcs := env.kube.CoreV1().Services("default")
	poll.Until(t, 30*time.Second, pollInterval, "Service default/"+name+" and condition ServiceReady", func(ctx context.Context) error {
		svc, err := svcs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if svc.Spec.Type != corev1.ServiceTypeExternalName || svc.Spec.ExternalName != routersName {
			return fmt.Errorf("Service %s %q, want ExternalName %s", svc.Spec.Type, svc.Spec.ExternalName, routersName)
		}
		if ref := metav1.GetControllerOf(svc); ref == nil || ref.Kind != "Function" || ref.Name != name {
			return fmt.Errorf("Service owned by %v, want Function %s", ref, name)
		}
		c, err := functionCondition(ctx, name, "ServiceReady")
		if err != nil {
			return err
		}
		return poll.Unmet(c != nil && c.Status == metav1.ConditionTrue, "condition ServiceReady %+v", c)
	})

	got := runTestPod(t, "e2e-byname", "node2", testPodContainer("get", "get",
		"http://"+name+".default.svc.cluster.local/full", "http://"+name+".default.svc/svc", "http://"+name+".default/short"))
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 3 {
		t.Fatalf("the pod's calls: %q, want three answers", got)
	}
	for i, path := range []string{"/full", "/svc", "/short"} {
		if !strings.HasPrefix(lines[i], "200 ") || !strings.Contains(lines[i], "default/"+name) || !strings.Contains(lines[i], path) {
			t.Errorf("call %s by name: %q, want 200 from an instance of default/%s", path, lines[i], name)
		}
	}
}

// TestServiceNameTakenReported: a Function whose name a Service Skipper
// does not own already has is reported (condition ServiceReady False,
// reason ServiceNameTaken, a Warning Event), and the Service is left as it
// was.
func TestServiceNameTakenReported(t *testing.T) {
	const name = "taken"
	svcs := env.kube.CoreV1().Services("default")
	_ = svcs.Delete(t.Context(), name, metav1.DeleteOptions{})
	theirs := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "theirs"}},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "theirs.example.invalid"},
	}
	poll.Until(t, 30*time.Second, pollInterval, "Service default/"+name+" created", func(ctx context.Context) error {
		_, err := svcs.Create(ctx, theirs, metav1.CreateOptions{})
		return err
	})
	t.Cleanup(func() { _ = svcs.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	createFunction(t, name, nil)
	poll.Until(t, 30*time.Second, pollInterval, "condition ServiceReady False, ServiceNameTaken", func(ctx context.Context) error {
		c, err := functionCondition(ctx, name, "ServiceReady")
		if err != nil {
			return err
		}
		return poll.Unmet(c != nil && c.Status == metav1.ConditionFalse && c.Reason == "ServiceNameTaken", "condition ServiceReady %+v", c)
	})
	poll.Until(t, 30*time.Second, pollInterval, "a Warning Event ServiceNameTaken", func(ctx context.Context) error {
		evs, err := env.kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=ServiceNameTaken"})
		if err != nil {
			return err
		}
		return poll.Unmet(len(evs.Items) > 0 && evs.Items[0].Type == corev1.EventTypeWarning, "%d events", len(evs.Items))
	})
	got, err := svcs.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.ExternalName != theirs.Spec.ExternalName || len(got.OwnerReferences) != 0 || got.Labels["app"] != "theirs" {
		t.Errorf("the taken Service changed: %s, owners %v, labels %v", got.Spec.ExternalName, got.OwnerReferences, got.Labels)
	}
	// The controller's identity may not take it either (admission).
	patch := `{"spec":{"externalName":"` + routersName + `"}}`
	_, err = asControllerClient(t).CoreV1().Services("default").Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "only Services owned by the Function") {
		t.Errorf("patching the taken Service as the controller: %v, want refused by skipper-controller-services", err)
	}
}
