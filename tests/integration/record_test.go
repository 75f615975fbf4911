package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"skipper.dev/skipper/controller"
	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

// controllerUser is the controller's identity: the requests it makes meet
// its RBAC and the admission policy deploy/base/controller-admission.yaml.
const controllerUser = "system:serviceaccount:skipper-system:skipper-controller"

// TestRecordPatchOnTheAPIServer applies the record of a claim, the JSON
// patch with test ops the controller builds (controller.RecordPatch), to
// pods on the real API server as the controller's ServiceAccount, as
// controller/decide_test.go's TestRecordPatch does against a hand-written
// reactor: it lands on a pool pod as read, or with only its status written
// since; it fails with 422 Invalid (what the controller takes for a lost
// claim) when another Function's claim recorded the pod first, when its
// labels or owners changed since the read, when another pod took its name,
// and when it is applied a second time.
//
// The pods are never scheduled (a scheduler of that name does not run) and
// belong to a pool no Deployment makes; the Functions they are recorded for
// have that pool and no load, so no controller claims or retires them, and
// no pod is ever labelled for a Function without its ownerReference (the
// controllers would delete it as an orphan).
func TestRecordPatchOnTheAPIServer(t *testing.T) {
	var b [3]byte
	_, _ = rand.Read(b[:])
	pool := "record-" + hex.EncodeToString(b[:])
	idle := map[string]any{"pool": pool, "port": int64(8080), "maxInstances": int64(1), "idleTimeout": "1h"}
	fn := functionObject(t, createFunction(t, "record", idle))
	other := functionObject(t, createFunction(t, "record-other", idle))
	// Owners that exist: the garbage collector deletes a pod whose owners
	// are gone, and drops an owner reference that dangles.
	owner, another := ownerConfigMap(t, pool+"-owner"), ownerConfigMap(t, pool+"-another")
	ownedBy := func(p *corev1.Pod) { p.OwnerReferences = []metav1.OwnerReference{owner} }
	ctl := controllerClient(t)
	pods := env.kube.CoreV1().Pods(namespace)

	for _, tc := range []struct {
		name  string
		setup func(*corev1.Pod)                    // the pod as created
		since func(t *testing.T, live *corev1.Pod) // what changes between the read and the record
		lost  bool                                 // the record fails: the claim is lost
	}{
		{name: "unchanged pod with an owner", setup: ownedBy},
		{name: "unchanged pod without owners"},
		{name: "pod with annotations", setup: func(p *corev1.Pod) { p.Annotations = map[string]string{"example.com/a": "b"} }},
		{
			// Issue 15: the kubelet's status writes must not fail the record
			// of a claim the instance already decided.
			name: "status written since the read",
			since: func(t *testing.T, live *corev1.Pod) {
				live.Status.Conditions = append(live.Status.Conditions, corev1.PodCondition{Type: "example.com/Other", Status: corev1.ConditionTrue})
				if _, err := pods.UpdateStatus(t.Context(), live, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "recorded for another Function since the read",
			since: func(t *testing.T, live *corev1.Pod) {
				f := false
				ref := metav1.OwnerReference{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "Function", Name: other.Name, UID: other.UID, Controller: &f}
				mergePatch(t, live.Name, map[string]any{"metadata": map[string]any{
					"labels":          map[string]any{v1alpha1.LabelFunction: other.Name},
					"ownerReferences": append(live.OwnerReferences, ref),
				}})
			},
			lost: true,
		},
		{
			name: "labels changed since the read",
			since: func(t *testing.T, live *corev1.Pod) {
				mergePatch(t, live.Name, map[string]any{"metadata": map[string]any{"labels": map[string]any{"example.com/changed": "true"}}})
			},
			lost: true,
		},
		{
			name:  "owners changed since the read",
			setup: ownedBy,
			since: func(t *testing.T, live *corev1.Pod) {
				refs := append(live.OwnerReferences, another)
				mergePatch(t, live.Name, map[string]any{"metadata": map[string]any{"ownerReferences": refs}})
			},
			lost: true,
		},
		{
			name: "another pod of the same name",
			since: func(t *testing.T, live *corev1.Pod) {
				zero := int64(0)
				if err := pods.Delete(t.Context(), live.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
					t.Fatal(err)
				}
				poll.Until(t, 30*time.Second, pollInterval, "pod "+live.Name+" gone", func(ctx context.Context) error {
					if _, err := pods.Get(ctx, live.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
						return fmt.Errorf("get: %v", err)
					}
					return nil
				})
				createPoolPod(t, live.Name, pool, nil)
			},
			lost: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("%s-%d", pool, time.Now().UnixNano()%1e6)
			createPoolPod(t, name, pool, tc.setup)
			cached, err := pods.Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.since != nil {
				tc.since(t, cached.DeepCopy())
			}
			at := time.Now()
			patch, err := controller.RecordPatch(cached, fn, at)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ctl.CoreV1().Pods(namespace).Patch(t.Context(), name, types.JSONPatchType, patch, metav1.PatchOptions{})
			if tc.lost {
				if !apierrors.IsInvalid(err) {
					t.Fatalf("record = %v, want 422 Invalid (a failed test op)", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("record: %v", err)
			}
			if l := got.Labels[v1alpha1.LabelFunction]; l != fn.Name {
				t.Errorf("label %s = %q, want %q", v1alpha1.LabelFunction, l, fn.Name)
			}
			refs := got.OwnerReferences
			if n := len(cached.OwnerReferences); len(refs) != n+1 || refs[n].UID != fn.UID || refs[n].Kind != "Function" ||
				refs[n].Controller == nil || *refs[n].Controller {
				t.Errorf("ownerReferences %+v, want those read and a non-controller one to Function %s", refs, fn.Name)
			}
			for k, v := range cached.Annotations {
				if got.Annotations[k] != v {
					t.Errorf("annotation %s = %q, want %q kept", k, got.Annotations[k], v)
				}
			}
			if len(got.Annotations) <= len(cached.Annotations) {
				t.Errorf("annotations %v: the claim's were not added", got.Annotations)
			}
			if _, err := ctl.CoreV1().Pods(namespace).Patch(t.Context(), name, types.JSONPatchType, patch, metav1.PatchOptions{}); !apierrors.IsInvalid(err) {
				t.Errorf("the record applied a second time: %v, want 422 Invalid", err)
			}
		})
	}
}

// controllerClient is a client of the cluster acting as the controller's
// ServiceAccount (the admin impersonates it).
func controllerClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(env.rest)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: controllerUser}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// ownerConfigMap creates ConfigMap name, deleted at the test's end, and
// returns an owner reference to it.
func ownerConfigMap(t *testing.T, name string) metav1.OwnerReference {
	t.Helper()
	cms := env.kube.CoreV1().ConfigMaps(namespace)
	cm, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cms.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: name, UID: cm.UID}
}

// functionObject reads Function name as its Go type.
func functionObject(t *testing.T, name string) *v1alpha1.Function {
	t.Helper()
	u, err := env.dyn.Resource(v1alpha1.Resource).Namespace(namespace).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var fn v1alpha1.Function
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &fn); err != nil {
		t.Fatal(err)
	}
	return &fn
}

// createPoolPod creates pod name of pool (setup, when set, changes it
// first), never scheduled, and deletes it at the test's end.
func createPoolPod(t *testing.T, name, pool string, setup func(*corev1.Pod)) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{v1alpha1.LabelPool: pool}},
		Spec: corev1.PodSpec{
			SchedulerName: "skipper-integration-unscheduled",
			Containers:    []corev1.Container{{Name: "app", Image: env.image}},
		},
	}
	if setup != nil {
		setup(p)
	}
	if _, err := env.kube.CoreV1().Pods(namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		err := env.kube.CoreV1().Pods(namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete pod %s: %v", name, err)
		}
	})
}

// mergePatch changes pod name as the cluster admin.
func mergePatch(t *testing.T, name string, patch map[string]any) {
	t.Helper()
	b, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.kube.CoreV1().Pods(namespace).Patch(t.Context(), name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch pod %s: %v", name, err)
	}
}
