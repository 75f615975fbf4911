package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// readyLog is when each pod was first seen ready, and when those the
// watch saw created were seen first.
type readyLog struct {
	mu    sync.Mutex
	m     map[string]time.Time
	added map[string]time.Time
}

func newReadyLog() *readyLog {
	return &readyLog{m: map[string]time.Time{}, added: map[string]time.Time{}}
}

// starts returns, for the pods seen created after from, the time from
// then to ready (not yet ready: not counted), and how many were created.
func (l *readyLog) starts(from time.Time) ([]time.Duration, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Duration
	n := 0
	for uid, a := range l.added {
		if a.Before(from) {
			continue
		}
		n++
		if r, ok := l.m[uid]; ok {
			out = append(out, r.Sub(a))
		}
	}
	return out, n
}

// callLines is one line per call, from begin: when it began, how long it
// took, and when the pod that answered was seen created and ready ("-":
// created before the watch's first second, or never seen ready), and
// whether it was served by a pod ready before the call (served, as the
// summary counted it).
func (l *readyLog) callLines(calls []burstCall, served []bool, begin time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	off := func(t time.Time, ok bool) string {
		if !ok {
			return "-"
		}
		return fmt.Sprintf("%+.3fs", t.Sub(begin).Seconds())
	}
	var out []string
	for i, cl := range calls {
		r, rok := l.m[cl.podUID]
		a, aok := l.added[cl.podUID]
		warm := "waited"
		switch {
		case cl.err != nil:
			warm = "failed: " + cl.err.Error()
		case served[i]:
			warm = "ready"
		}
		out = append(out, fmt.Sprintf("%s: began %s took %s pod created %s ready %s (%s)",
			cl.function, off(cl.start, true), cl.took.Round(time.Millisecond), off(a, aok), off(r, rok), warm))
	}
	return out
}

func (l *readyLog) at(uid string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.m[uid]
	return t, ok
}

// watch records the pool's pods' readiness until ctx ends; pods ready in
// the first list count as ready at since.
func (l *readyLog) watch(ctx context.Context, cs kubernetes.Interface, ns, pool string, since time.Time) error {
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + pool})
	if err != nil {
		return fmt.Errorf("watch pool pods: %w", err)
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			if ev.Type == watch.Added && !ready(*p) && now.Sub(since) > time.Second { // after the watch's first list
				l.mu.Lock()
				l.added[string(p.UID)] = now
				l.mu.Unlock()
			}
			if !ready(*p) {
				continue
			}
			l.mu.Lock()
			if _, seen := l.m[string(p.UID)]; !seen {
				l.m[string(p.UID)] = now
			}
			l.mu.Unlock()
		}
	}()
	return nil
}

// replicaLog is the pool Deployment's spec.replicas over time.
type replicaLog struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on each change
	points  []replicaPoint
}

type replicaPoint struct {
	at time.Time
	n  int32
}

func newReplicaLog() *replicaLog { return &replicaLog{changed: make(chan struct{})} }

func (l *replicaLog) watch(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	w, err := cs.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return fmt.Errorf("watch pool Deployment: %w", err)
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			d, ok := ev.Object.(*appsv1.Deployment)
			if !ok || d.Spec.Replicas == nil {
				continue
			}
			l.mu.Lock()
			if len(l.points) == 0 || l.points[len(l.points)-1].n != *d.Spec.Replicas {
				l.points = append(l.points, replicaPoint{time.Now(), *d.Spec.Replicas})
				close(l.changed)
				l.changed = make(chan struct{})
			}
			l.mu.Unlock()
		}
	}()
	return nil
}

// max is the most replicas from from on (the count in effect then
// included).
func (l *replicaLog) max(from time.Time) (int32, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m int32
	found := false
	for i, p := range l.points {
		inEffect := !p.at.After(from) && (i+1 == len(l.points) || l.points[i+1].at.After(from))
		if p.at.After(from) || inEffect {
			m, found = max(m, p.n), true
		}
	}
	return m, found
}

// waitAt waits until the replicas are n (after from), and says when.
func (l *replicaLog) waitAt(ctx context.Context, n int32, from time.Time, timeout time.Duration) (string, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		ch := l.changed
		var last replicaPoint
		if len(l.points) > 0 {
			last = l.points[len(l.points)-1]
		}
		l.mu.Unlock()
		if last.n == n {
			return fmt.Sprintf("back at %d %s after the last call", n, max(last.at.Sub(from), 0).Round(100*time.Millisecond)), nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return fmt.Sprintf("still %d, not %d, %s after the last call", last.n, n, timeout), errors.New("the pool did not shrink back")
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// timeline renders the changes as "+0.2s 6, +0.5s 11, …" from begin.
func (l *replicaLog) timeline(begin time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, p := range l.points {
		out = append(out, fmt.Sprintf("%+.1fs %d", p.at.Sub(begin).Seconds(), p.n))
	}
	if len(out) == 0 {
		return "none seen"
	}
	return fmt.Sprint(slices.Clip(out))
}
