package nodeagent

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testWorker(policy corev1.RestartPolicy, names ...string) *podWorker {
	a := &Agent{cfg: Config{NodeIP: netip.MustParseAddr("198.51.100.11")}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}, Spec: corev1.PodSpec{RestartPolicy: policy}}
	for _, n := range names {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: n, Image: "img"})
	}
	w := newPodWorker(a, pod)
	w.pod = pod
	return w
}

func exited(c *ctr, code int32) {
	c.everStarted = true
	c.state = stTerminated
	c.term = &corev1.ContainerStateTerminated{ExitCode: code}
}

func TestPhase(t *testing.T) {
	tests := []struct {
		name      string
		policy    corev1.RestartPolicy
		set       func(w *podWorker)
		want      corev1.PodPhase
		wantFinal bool
	}{
		{"nothing started", corev1.RestartPolicyAlways, func(w *podWorker) {}, corev1.PodPending, false},
		{"one running", corev1.RestartPolicyAlways, func(w *podWorker) { w.ctrs[0].state = stRunning }, corev1.PodRunning, false},
		{"never: all succeeded", corev1.RestartPolicyNever, func(w *podWorker) { exited(w.ctrs[0], 0); exited(w.ctrs[1], 0) }, corev1.PodSucceeded, true},
		{"never: one failed", corev1.RestartPolicyNever, func(w *podWorker) { exited(w.ctrs[0], 0); exited(w.ctrs[1], 2) }, corev1.PodFailed, true},
		{"never: one still running", corev1.RestartPolicyNever, func(w *podWorker) { exited(w.ctrs[0], 1); w.ctrs[1].state = stRunning }, corev1.PodRunning, false},
		{"always: exited restarts", corev1.RestartPolicyAlways, func(w *podWorker) { exited(w.ctrs[0], 0); exited(w.ctrs[1], 1) }, corev1.PodRunning, false},
		{"on failure: success ends", corev1.RestartPolicyOnFailure, func(w *podWorker) { exited(w.ctrs[0], 0); exited(w.ctrs[1], 0) }, corev1.PodSucceeded, true},
		{"on failure: failure restarts", corev1.RestartPolicyOnFailure, func(w *podWorker) { exited(w.ctrs[0], 0); exited(w.ctrs[1], 1) }, corev1.PodRunning, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := testWorker(tt.policy, "a", "b")
			tt.set(w)
			got, final := w.phase()
			if got != tt.want || final != tt.wantFinal {
				t.Errorf("phase() = %s, %v; want %s, %v", got, final, tt.want, tt.wantFinal)
			}
		})
	}
}

func TestBuildStatus(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	w := testWorker(corev1.RestartPolicyAlways, "app")
	w.ip = netip.MustParseAddr("198.18.1.7")
	w.startTime = metav1.NewTime(now)
	c := w.ctrs[0]
	c.state, c.startedAt, c.containerID, c.imageID, c.everStarted = stRunning, now, "skipper://42", "skipper:///bin/app", true
	scheduled := corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}
	base := corev1.PodStatus{Conditions: []corev1.PodCondition{scheduled}, QOSClass: corev1.PodQOSBestEffort}

	st := w.buildStatus(base, now)
	if st.Phase != corev1.PodRunning || st.PodIP != "198.18.1.7" || st.HostIP != "198.51.100.11" || st.QOSClass != corev1.PodQOSBestEffort {
		t.Errorf("status %+v", st)
	}
	cond := func(st corev1.PodStatus, typ corev1.PodConditionType) corev1.ConditionStatus {
		for _, c := range st.Conditions {
			if c.Type == typ {
				return c.Status
			}
		}
		return "missing"
	}
	if got := cond(st, corev1.PodReady); got != corev1.ConditionFalse {
		t.Errorf("Ready before the probe passed = %s", got)
	}
	if got := cond(st, corev1.PodScheduled); got != corev1.ConditionTrue {
		t.Errorf("PodScheduled (the scheduler's) = %s", got)
	}
	c.ready = true
	st = w.buildStatus(base, now.Add(time.Second))
	if got := cond(st, corev1.PodReady); got != corev1.ConditionTrue {
		t.Errorf("Ready after the probe passed = %s", got)
	}
	want := corev1.ContainerStatus{Name: "app", Image: "img", ImageID: "skipper:///bin/app", ContainerID: "skipper://42", Ready: true,
		Started: ptrTo(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(now)}}}
	if diff := cmp.Diff([]corev1.ContainerStatus{want}, st.ContainerStatuses); diff != "" {
		t.Errorf("container statuses (-want +got):\n%s", diff)
	}
	// The transition time of an unchanged condition holds across builds.
	again := w.buildStatus(base, now.Add(time.Minute))
	if diff := cmp.Diff(st.Conditions, again.Conditions); diff != "" {
		t.Errorf("conditions changed without a transition (-first +second):\n%s", diff)
	}
}

func ptrTo[T any](v T) *T { return &v }
