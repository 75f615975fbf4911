package controller

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// currentSet is the function's ready instance set: the informer's view plus
// claims it does not show yet, minus pods the caller found unusable.
func (c *controller) currentSet(fn *v1alpha1.Function, port int32, unusable []string) []instance {
	now := time.Now()
	pods := c.cache.functionPods(fn.Namespace, fn.Name)
	return instanceSet(fn, port, pods, c.assumedPods(fn.Key(), pods, now), append(c.retiredUIDs(now), unusable...))
}

// retire keeps a pod this replica withdrew or is deleting out of every
// instance set until until (a drain's timeout, or assumedTTL after the
// delete, by when the informer shows the deletion).
func (c *controller) retire(uid types.UID, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if until.After(c.retired[uid]) {
		c.retired[uid] = until
	}
}

// retiredLocked reports whether uid is retired at now; c.mu is held.
func (c *controller) retiredLocked(uid types.UID, now time.Time) bool {
	until, ok := c.retired[uid]
	return ok && now.Before(until)
}

func (c *controller) retiredUIDs(now time.Time) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for uid, until := range c.retired {
		if !now.Before(until) {
			delete(c.retired, uid)
			continue
		}
		out = append(out, string(uid))
	}
	return out
}

// assumedPods returns the claims of key the informer does not show yet.
func (c *controller) assumedPods(key string, cached []*corev1.Pod, now time.Time) []*corev1.Pod {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.assumedLocked(key, cached, now)
}

// assumedLocked returns the claims of key the informer does not show in
// cached, or shows still marked assign-pending (the claim patch, not yet
// the record of the assignment that followed it), forgetting those it
// shows recorded (recording how long that took) and those older than
// assumedTTL; c.mu is held.
func (c *controller) assumedLocked(key string, cached []*corev1.Pod, now time.Time) []*corev1.Pod {
	as := c.assumed[key]
	if len(as) == 0 {
		return nil
	}
	var keep []assumedPod
	var out []*corev1.Pod
	for _, a := range as {
		if i := slices.IndexFunc(cached, func(p *corev1.Pod) bool { return p.UID == a.pod.UID }); i >= 0 && !assignPending(cached[i]) {
			c.lastLag = now.Sub(a.at)
			continue
		}
		if now.Sub(a.at) > assumedTTL && !c.recording[a.pod.UID] {
			// A claim whose record is still being written stays assumed
			// however long that takes (an API server outage): the instance
			// is the function's.
			continue
		}
		keep = append(keep, a)
		out = append(out, a.pod)
	}
	if len(keep) == 0 {
		delete(c.assumed, key)
	} else {
		c.assumed[key] = keep
	}
	return out
}
