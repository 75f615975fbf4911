package controller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/scaling"
)

// The pool autoscaler's annotations on a pool Deployment (issue 15, item
// 6); docs/operations.md, "Pool autoscaling", describes them.
const (
	annPoolMin      = "skipper.dev/pool-min"
	annPoolMax      = "skipper.dev/pool-max"
	annPoolWindow   = "skipper.dev/pool-window"
	annPoolHeadroom = "skipper.dev/pool-headroom"
)

// Defaults of the pool annotations, and their bounds.
const (
	defaultPoolMin = 1
	defaultPoolMax = 20
	maxPoolMax     = 1000
	minPoolWindow  = time.Second
	// poolResync is how often an autoscaled pool with claims in its window
	// is decided again (its rate falls as they leave the window), beside
	// every event of its pods.
	poolResync = time.Second
)

// poolPolicy is a pool Deployment's autoscaling annotations, parsed.
type poolPolicy struct {
	min, max, headroom int32
	window             time.Duration
}

// autoscaled reports whether d opted in to the pool autoscaler.
func autoscaled(d *appsv1.Deployment) bool {
	return d.Annotations[v1alpha1.AnnotationAutoscale] == "true"
}

// poolPolicyOf parses d's pool annotations, all problems at once.
func poolPolicyOf(d *appsv1.Deployment) (poolPolicy, error) {
	p := poolPolicy{min: defaultPoolMin, max: defaultPoolMax, headroom: scaling.DefaultPoolHeadroom, window: scaling.DefaultPoolWindow}
	var errs []error
	count := func(name string, dst *int32, lo, hi int64) {
		v, ok := d.Annotations[name]
		if !ok {
			return
		}
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < lo || n > hi {
			errs = append(errs, fmt.Errorf("%s %q: want a whole number in [%d, %d]", name, v, lo, hi))
			return
		}
		*dst = int32(n)
	}
	count(annPoolMin, &p.min, 0, maxPoolMax)
	count(annPoolMax, &p.max, 1, maxPoolMax)
	count(annPoolHeadroom, &p.headroom, 0, maxPoolMax)
	if v, ok := d.Annotations[annPoolWindow]; ok {
		w, err := time.ParseDuration(v)
		if err != nil || w < minPoolWindow || w > maxPoolWindow {
			errs = append(errs, fmt.Errorf("%s %q: want a duration in [%s, %s]", annPoolWindow, v, minPoolWindow, maxPoolWindow))
		} else {
			p.window = w
		}
	}
	if p.max < p.min {
		errs = append(errs, fmt.Errorf("%s %d is below %s %d", annPoolMax, p.max, annPoolMin, p.min))
	}
	if p.min == 0 && p.headroom == 0 {
		// Nothing would ever be ready, and claims that wait are not
		// claims: the pool could never grow again.
		errs = append(errs, fmt.Errorf("%s 0 with %s 0 leaves the pool empty for good", annPoolMin, annPoolHeadroom))
	}
	return p, errors.Join(errs...)
}

// poolKeyOf is the pool key ("namespace/pool") of a pool Deployment or
// pod; "" for other objects.
func poolKeyOf(obj metav1.Object) string {
	if pool := obj.GetLabels()[v1alpha1.LabelPool]; pool != "" {
		return obj.GetNamespace() + "/" + pool
	}
	return ""
}

// syncPool sets an autoscaled pool's replicas, when this replica owns the
// pool on the ring: scaling.DecidePool over the claims the pool saw in its
// window, its pods' measured time to ready, its ready and unrecorded pods.
func (c *controller) syncPool(ctx context.Context, key string) error {
	ns, pool, ok := splitKey(key)
	if !ok {
		return nil
	}
	c.mu.Lock()
	synced := c.ringSynced
	c.mu.Unlock()
	if !synced {
		return nil // the ring's first sync queues every pool again
	}
	if !c.owns(key) {
		c.pools.disowned(key)
		c.metrics.poolTarget.DeleteLabelValues(key)
		return nil
	}
	var deps []*appsv1.Deployment
	for _, d := range c.cache.poolDeployments(ns, pool) {
		if autoscaled(d) && d.DeletionTimestamp == nil {
			deps = append(deps, d)
		}
	}
	switch {
	case len(deps) == 0:
		c.metrics.poolTarget.DeleteLabelValues(key)
		return nil
	case len(deps) > 1:
		for _, d := range deps {
			c.deploymentEvent(d, corev1.EventTypeWarning, "PoolAutoscaleAmbiguous",
				"%d autoscaled Deployments carry %s=%s; none is scaled", len(deps), v1alpha1.LabelPool, pool)
		}
		return nil
	}
	d := deps[0]
	pol, err := poolPolicyOf(d)
	if err != nil {
		c.deploymentEvent(d, corev1.EventTypeWarning, "InvalidPoolAutoscale", "not scaled: %v", err)
		return nil // the Deployment's next update brings it back
	}
	now := time.Now()
	cached := int32(1)
	if d.Spec.Replicas != nil {
		cached = *d.Spec.Replicas
	}
	replicas := c.pools.replicas(key, cached, now)
	c.pools.owned(key, now, replicas) // a new owner waits a window before it scales down
	snap := c.pools.snapshot(key, now, pol.window)
	var ready int32
	for _, p := range c.cache.poolPods(ns, pool) {
		if v1alpha1.PodReady(p) { // ready and not terminating
			ready++
		}
	}
	dec := scaling.DecidePool(scaling.PoolInput{
		Now: now, Claims: snap.claims, Window: pol.window, ReadyTime: snap.readyTime, Headroom: pol.headroom,
		Min: pol.min, Max: pol.max, Replicas: replicas, Ready: ready, Unrecorded: c.unrecordedIn(ns, pool, now),
		Recent: snap.recent, LastUp: snap.lastUp, Asked: snap.asked,
	})
	c.pools.decided(key, now, dec.Demand, pol.window)
	if len(snap.claims) > 0 || dec.Reason == scaling.PoolReasonStabilized || dec.Reason == scaling.PoolReasonUnrecorded {
		c.poolQueue.AddAfter(key, poolResync) // held or decaying: decided again soon
	}
	c.metrics.poolTarget.WithLabelValues(key).Set(float64(dec.Replicas))
	if dec.Replicas == replicas {
		return nil
	}
	patch := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, dec.Replicas)
	// The Deployment itself, not its scale subresource: the admission
	// policy skipper-controller-pools can check that it is an autoscaled
	// pool and that nothing but spec.replicas changes.
	if _, err := c.core.AppsV1().Deployments(ns).Patch(ctx, d.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("scale pool %s (Deployment %s) to %d: %w", key, d.Name, dec.Replicas, err)
	}
	c.pools.scaled(key, now, replicas, dec.Replicas)
	shown := snap.readyTime
	if shown == 0 {
		shown = scaling.DefaultPoolReadyTime
	}
	c.log.Info("pool scaled", "pool", key, "deployment", d.Name, "from", replicas, "to", dec.Replicas,
		"reason", dec.Reason, "claims", dec.Claims, "rate", dec.Rate, "ready_time", shown, "ready", ready, "demand", dec.Demand)
	c.deploymentEvent(d, corev1.EventTypeNormal, "PoolScaled", "replicas %d → %d, %s × ready time %s, headroom %d, demand %d, %d ready, within [%d, %d]",
		replicas, dec.Replicas, dec, shown.Round(time.Millisecond), pol.headroom, dec.Demand, ready, pol.min, pol.max)
	return nil
}

// unrecordedIn counts pool ns/pool's pods that this replica knows hold a
// function, or may, while the informer does not show them recorded: its
// claims not yet recorded (assumed), those being assigned (reserved),
// those whose instance said it holds a function (held) and those whose
// record it is writing. The Deployment's selector still matches them.
// Other replicas' unrecorded claims are not seen here (docs/operations.md
// says what that leaves).
func (c *controller) unrecordedIn(ns, pool string, now time.Time) int32 {
	pods := c.cache.poolPods(ns, pool) // unrecorded pods still show here, unlabelled
	fnPods := map[string][]*corev1.Pod{}
	for _, k := range c.claims.assumedKeys(ns) {
		_, name, _ := splitKey(k)
		fnPods[k] = c.cache.functionPods(ns, name)
	}
	return int32(c.claims.unrecordedIn(pool, pods, fnPods, now))
}

// enqueuePools queues every pool Deployment's pool (the ring changed:
// pools may have moved here).
func (c *controller) enqueuePools() {
	for _, s := range c.cache.sets {
		for _, obj := range s.deployments.GetStore().List() {
			if d, ok := obj.(*appsv1.Deployment); ok && autoscaled(d) {
				c.poolQueue.Add(poolKeyOf(d))
			}
		}
	}
}

// poolChanged reacts to a pool Deployment event: its namespace may need the
// key ConfigMap, claim waiters re-check, and its waiters series exists at
// zero while the pool does.
func (c *controller) poolChanged(obj any, deleted bool) {
	d, ok := obj.(*appsv1.Deployment)
	if !ok {
		return
	}
	c.nsQueue.Add(d.Namespace)
	c.podsChanged.notify()
	if pool := d.Labels[v1alpha1.LabelPool]; pool != "" {
		c.poolQueue.Add(d.Namespace + "/" + pool)
		if deleted {
			c.metrics.poolWaiters.DeleteLabelValues(d.Namespace + "/" + pool)
			if len(c.cache.poolDeployments(d.Namespace, pool)) == 0 {
				c.pools.drop(d.Namespace + "/" + pool)
				c.metrics.poolTarget.DeleteLabelValues(d.Namespace + "/" + pool)
			}
		} else {
			c.metrics.poolWaiters.WithLabelValues(d.Namespace + "/" + pool)
		}
	}
}

// poolPodEvent feeds a pool pod's event to the pool statistics and queues
// its pool. live: the informer saw it while watching (not in its first
// list).
func (c *controller) poolPodEvent(obj any, live, deleted bool) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	key := poolKeyOf(p)
	if key == "" {
		return
	}
	c.preconnect(p, deleted)
	if deleted {
		c.pools.forget(key, p.UID)
	} else {
		c.pools.observe(p, time.Now(), live)
	}
	c.poolQueue.Add(key)
}

// deploymentEvent records an Event on a pool Deployment.
func (c *controller) deploymentEvent(d *appsv1.Deployment, typ, reason, format string, a ...any) {
	if c.recorder != nil {
		c.recorder.Eventf(d, typ, reason, format, a...)
	}
}
