package controller

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/internal/poll"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

func TestStaleCallers(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("private", "echo")
	fn.Spec.Callers = v1alpha1.Callers{Namespaces: []string{"team-a"}}
	want := callersDigest(&fn.Spec.Callers)
	if want == "" || callersDigest(&v1alpha1.Callers{}) != "" ||
		callersDigest(&v1alpha1.Callers{Namespaces: []string{"team-a", "team-a"}}) != want {
		t.Fatalf("digests: %q, none %q", want, callersDigest(&v1alpha1.Callers{}))
	}
	instance := func(name, digest string, mod ...func(*corev1.Pod)) *corev1.Pod {
		p := poolPod(name, "echo")
		p.Labels[v1alpha1.LabelFunction] = fn.Name
		p.OwnerReferences = append(p.OwnerReferences, functionOwnerRef(fn))
		if digest != "" {
			p.Annotations = map[string]string{annCallers: digest}
		}
		for _, m := range mod {
			m(p)
		}
		return p
	}
	pods := []*corev1.Pod{
		instance("current", want),
		instance("old", "0123456789abcdef"),
		instance("none", ""),
		instance("deleting", "", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }),
		instance("not-ready", "", func(p *corev1.Pod) { p.Status.Conditions = nil }),
		poolPod("warm", "echo"),
	}
	var got []string
	for _, p := range staleCallers(fn, pods) {
		got = append(got, p.Name)
	}
	if len(got) != 2 || got[0] != "old" || got[1] != "none" {
		t.Errorf("stale = %v, want [old none]", got)
	}
	open := fn.DeepCopy()
	open.Spec.Callers = v1alpha1.Callers{}
	if s := staleCallers(open, pods); len(s) != 2 || s[0].Name != "current" || s[1].Name != "old" {
		t.Errorf("callers removed: stale %v, want [current old]", s)
	}
	once := fn.DeepCopy()
	once.Spec.Oneshot = true
	if s := staleCallers(once, pods); s != nil {
		t.Errorf("oneshot: stale %v, want none", s)
	}
}

// TestCallersChangeReassigns: a claim hands the instance the Function's
// callers and notes them on the pod; when the callers change, the owner
// assigns the instance again with the new ones.
func TestCallersChangeReassigns(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("private", "echo")
	fn.Spec.Callers = v1alpha1.Callers{Namespaces: []string{"team-a"}}
	e.add(poolDeploy("echo"), fn, poolPod("p1", "echo"))
	r := startReplica(t, e, "ctl-0", nil, nil)
	req := &skipperv1.GetInstanceRequest{Function: &skipperv1.FunctionRef{Namespace: "default", Name: "private"},
		Caller: &skipperv1.Caller{Namespace: "team-a", ServiceAccount: "default"}}
	if _, err := r.client.GetInstance(t.Context(), req); err != nil {
		t.Fatalf("GetInstance: %v", err)
	}
	reqs := e.assignRequests()
	if len(reqs) != 1 || reqs[0].Callers == nil || len(reqs[0].Callers.Namespaces) != 1 || reqs[0].Callers.Namespaces[0] != "team-a" {
		t.Fatalf("assign requests %+v, want one carrying callers [team-a]", reqs)
	}
	poll.Until(t, pollTimeout, pollInterval, "p1's record with its callers", func(context.Context) error {
		return callersNoted(e.pod("p1"), fn)
	})

	// The callers change: p1 is assigned again with the new ones.
	fn.Spec.Callers = v1alpha1.Callers{Namespaces: []string{"team-b"}}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(fn)
	if err != nil {
		t.Fatal(err)
	}
	fns := e.dyn.Resource(v1alpha1.Resource).Namespace("default")
	cur, err := fns.Get(t.Context(), "private", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	us := &unstructured.Unstructured{Object: u}
	us.SetResourceVersion(cur.GetResourceVersion())
	if _, err := fns.Update(t.Context(), us, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, pollInterval, "p1 assigned again with callers [team-b] and noted", func(context.Context) error {
		reqs := e.assignRequests()
		last := reqs[len(reqs)-1]
		if len(reqs) < 2 || last.Callers == nil || len(last.Callers.Namespaces) != 1 || last.Callers.Namespaces[0] != "team-b" {
			return fmt.Errorf("%d assign requests, the last with callers %+v", len(reqs), last.Callers)
		}
		return callersNoted(e.pod("p1"), fn)
	})
	// The instance accepts each: bound to its own request, with a fresh id
	// (a re-assign is no replay).
	used := assign.NewUsed(0)
	for i, r := range e.assignRequests() {
		c, err := assign.VerifyRequest([]ed25519.PublicKey{e.publicKey()}, r, "uid-p1", time.Now())
		if err == nil {
			err = used.Use(c, time.Now())
		}
		if err != nil {
			t.Errorf("assign %d (callers %+v): the instance would refuse it: %v", i, r.Callers, err)
		}
	}
}

// callersNoted says whether p's record notes fn's callers, as a poll.Until
// condition.
func callersNoted(p *corev1.Pod, fn *v1alpha1.Function) error {
	if got, want := p.Annotations[annCallers], callersDigest(&fn.Spec.Callers); got != want {
		return fmt.Errorf("%s notes callers %q, want %q", p.Name, got, want)
	}
	return nil
}
