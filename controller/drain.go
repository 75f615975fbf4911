package controller

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/scaling"
)

// drain is an instance withdrawn from the set, waiting to be deleted.
type drain struct {
	pod *corev1.Pod
	// gen is the first generation without the instance.
	gen   uint64
	since time.Time
	// ackedAt is when every subscribed router was first seen to hold gen;
	// in-flight counts only from reports a full interval after it.
	ackedAt time.Time
}

// progressDrains deletes each withdrawn instance once every subscribed
// router acknowledged a generation without it and no router reports
// requests in flight on it, or once --drain-timeout has passed.
func (s *supervisor) progressDrains(ctx context.Context, now time.Time) {
	for uid, d := range s.drains {
		timedOut := now.Sub(d.since) >= s.cfg.DrainTimeout
		if d.ackedAt.IsZero() && s.host.acked(s.key, d.gen) {
			d.ackedAt = now
		}
		var inst scaling.Instance
		s.mu.Lock()
		s.window.Fill(now, s.cfg.HeartbeatTimeout, string(uid), &inst)
		s.mu.Unlock()
		// A report sent before the ack may predate requests the router
		// started on the old set: in-flight counts once a report interval
		// has passed since the ack.
		quiet := !d.ackedAt.IsZero() && now.Sub(d.ackedAt) >= s.cfg.ReportInterval && inst.InFlight == 0
		if !quiet && !timedOut {
			continue
		}
		reason := "drained"
		if !quiet {
			reason = "drain timeout"
		}
		s.host.remove(ctx, d.pod, reason, now.Add(assumedTTL))
		delete(s.drains, uid)
	}
}

// withdraw takes pods out of fn's instance set until until, pushes the new
// set to subscribed routers and returns its generation.
func (c *controller) withdraw(fn *v1alpha1.Function, port int32, pods []*corev1.Pod, now, until time.Time) uint64 {
	for _, p := range pods {
		c.claims.retire(p.UID, until)
	}
	st, changed := c.observe(fn, c.currentSet(fn, port, nil), now)
	if changed {
		c.hub.publish(fn.Key(), st.update(fn))
	}
	return st.gen
}

// acked implements supervisorHost.
func (c *controller) acked(key string, gen uint64) bool { return c.hub.ackedAll(key, gen) }

// remove implements supervisorHost: deletePod, then retire until until.
func (c *controller) remove(ctx context.Context, pod *corev1.Pod, reason string, until time.Time) {
	c.deletePod(ctx, pod, reason)
	c.claims.retire(pod.UID, until)
}

// deletePod deletes an instance this replica withdrew, and never another
// pod of the same name (deleteUID).
func (c *controller) deletePod(ctx context.Context, pod *corev1.Pod, reason string) {
	if _, err := deleteUID(ctx, c.core.CoreV1().Pods(pod.Namespace), pod.Name, pod.UID); err != nil {
		c.log.Error("delete instance", "pod", pod.Namespace+"/"+pod.Name, "reason", reason, "err", err)
		return
	}
	c.log.Info("deleted instance", "pod", pod.Namespace+"/"+pod.Name, "reason", reason)
}

// deleter is the Delete of one resource's typed client (Pods(ns),
// ConfigMaps(ns), ...).
type deleter interface {
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// deleteUID deletes the object called name whose UID is uid, and only it:
// the UID precondition makes sure an object re-created under that name
// meanwhile is never hit. It reports whether this call deleted it.
//
// NotFound (the object is gone already) and Conflict (the precondition
// failed: the name now holds another object, so the one asked for is gone
// too) are not errors: the goal of the delete, no object with uid, holds
// either way, and the informer reports what is there now. Treating a
// Conflict as a failure would retry, or log, a delete that can never
// succeed and is no longer needed. Every other error is returned as is.
func deleteUID(ctx context.Context, d deleter, name string, uid types.UID) (bool, error) {
	err := d.Delete(ctx, name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(uid))})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return false, nil
	}
	return false, err
}
