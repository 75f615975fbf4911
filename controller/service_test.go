package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

const testTarget = "skipper.skipper-system.svc.cluster.local"

func TestDecideService(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	fn.UID = "uid-hello"
	ours := functionService(fn, testTarget)
	with := func(f func(*corev1.Service)) *corev1.Service {
		s := ours.DeepCopy()
		f(s)
		return s
	}
	previous := with(func(s *corev1.Service) { s.OwnerReferences[0].UID = "uid-before" })
	digit := testFunction("1hello")
	for _, tc := range []struct {
		name string
		fn   *v1alpha1.Function
		have *corev1.Service
		want serviceAction
		msg  string // in the message, when not empty
	}{
		{"none", fn, nil, serviceCreate, ""},
		{"ours, as wanted", fn, ours, serviceKeep, ""},
		{"ours, naming elsewhere", fn, with(func(s *corev1.Service) { s.Spec.ExternalName = "old.skipper-system.svc.cluster.local" }), servicePatch, ""},
		{"ours, made a ClusterIP", fn, with(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP }), servicePatch, ""},
		{"a deleted Function's of this name", fn, previous, serviceWait, ""},
		{"someone else's", fn, with(func(s *corev1.Service) { s.OwnerReferences = nil }), serviceTaken, "no owner"},
		{"another kind's", fn, with(func(s *corev1.Service) { s.OwnerReferences[0].Kind, s.OwnerReferences[0].UID = "Deployment", "uid-d" }), serviceTaken, "owner Deployment hello"},
		{"a Function's of another name", fn, with(func(s *corev1.Service) { s.OwnerReferences[0].Name, s.OwnerReferences[0].UID = "other", "uid-other" }), serviceTaken, "owner Function other"},
		{"a name that is no Service name", digit, nil, serviceNoName, "x-skipper-function"},
	} {
		got, msg := decideService(tc.fn, tc.have, testTarget)
		if got != tc.want || !strings.Contains(msg, tc.msg) || (tc.msg == "") != (msg == "") {
			t.Errorf("%s: %v %q, want %v with %q", tc.name, got, msg, tc.want, tc.msg)
		}
	}
	if ref := metav1.GetControllerOf(ours); ref == nil || ref.UID != fn.UID || ours.Spec.Type != corev1.ServiceTypeExternalName || ours.Spec.ExternalName != testTarget {
		t.Errorf("the wanted Service: owner %v, %s %s", ref, ours.Spec.Type, ours.Spec.ExternalName)
	}
}

// TestFunctionServiceKept: the owner creates a Function's Service, points
// it back at the routers when it is changed, and reports (condition,
// Event) a name another Service holds, which it leaves alone.
func TestFunctionServiceKept(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	taken := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "taken"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "theirs.example"}}
	if _, err := e.core.CoreV1().Services("default").Create(t.Context(), taken, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.add(poolDeploy("echo"), e.fnFor("hello", "echo"), e.fnFor("taken", "echo"))
	startReplica(t, e, "ctl-0", nil, nil)
	svcs := e.core.CoreV1().Services("default")
	service := func(ctx context.Context) (*corev1.Service, error) { return svcs.Get(ctx, "hello", metav1.GetOptions{}) }
	poll.Until(t, pollTimeout, pollInterval, "Service hello, and ServiceReady", func(ctx context.Context) error {
		s, err := service(ctx)
		if err != nil {
			return err
		}
		if s.Spec.ExternalName != testTarget || metav1.GetControllerOf(s) == nil {
			return fmt.Errorf("Service %s %s, owners %v", s.Spec.Type, s.Spec.ExternalName, s.OwnerReferences)
		}
		c := e.condition("hello", conditionServiceReady)
		return poll.Unmet(c != nil && c["status"] == "True", "condition %v", c)
	})
	patch := []byte(`{"spec":{"externalName":"elsewhere.example"}}`)
	if _, err := svcs.Patch(t.Context(), "hello", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, pollInterval, "Service hello pointed at the routers again", func(ctx context.Context) error {
		s, err := service(ctx)
		if err != nil {
			return err
		}
		return poll.Unmet(s.Spec.ExternalName == testTarget, "externalName %s", s.Spec.ExternalName)
	})
	poll.Until(t, pollTimeout, pollInterval, "taken reported", func(context.Context) error {
		c := e.condition("taken", conditionServiceReady)
		return poll.Unmet(c != nil && c["status"] == "False" && c["reason"] == reasonServiceNameTaken, "condition %v", c)
	})
	poll.Until(t, pollTimeout, pollInterval, "a Warning Event", func(ctx context.Context) error {
		evs, err := e.core.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Reason == reasonServiceNameTaken && ev.InvolvedObject.Name == "taken" && ev.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("%d events, none ServiceNameTaken", len(evs.Items))
	})
	got, err := svcs.Get(t.Context(), "taken", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.ExternalName != "theirs.example" || len(got.OwnerReferences) != 0 {
		t.Errorf("the taken Service changed: %s, owners %v", got.Spec.ExternalName, got.OwnerReferences)
	}
}
