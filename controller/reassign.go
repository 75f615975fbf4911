package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
)

// An instance checks its callers (issue 16) against those its assign
// handed it. When a Function's callers change, its owner assigns each
// instance again (a repeat for the function the instance holds is
// accepted, with what it carries now) and notes on the pod which callers
// it holds: the pod's annotation, against the Function's, is the level
// every tick compares.

// annCallers is the digest (callersDigest) of the callers the instance
// was last assigned with; absent: none.
const annCallers = "skipper.dev/callers"

// reassignBatch bounds the re-assigns one tick starts for a function.
const reassignBatch = 8

// reassignRest is how long a pod whose re-assign failed is left before
// the next try (the instance refusing, or the patch): a failing pod is not
// assigned again every tick.
const reassignRest = 10 * time.Second

// assignCallers are a Function's callers as an assign carries them (nil:
// any caller).
func assignCallers(c *v1alpha1.Callers) *assign.Callers {
	if c.Empty() {
		return nil
	}
	p := callerPolicyOf(c)
	return &assign.Callers{Namespaces: split(p.namespaces), ServiceAccounts: split(p.serviceAccounts)}
}

// callersDigest names a Function's callers in an annotation: "" for none,
// else a hash of their sorted lists.
func callersDigest(c *v1alpha1.Callers) string {
	if c.Empty() {
		return ""
	}
	p := callerPolicyOf(c)
	h := sha256.Sum256([]byte(p.namespaces + "\x00" + p.serviceAccounts))
	return hex.EncodeToString(h[:8])
}

// staleCallers are the recorded, ready instances of fn among pods whose
// callers are not fn's current ones, at most reassignBatch. A oneshot
// instance is left as it is: it serves one call, and takes a repeat
// assign only from the claim that won it.
func staleCallers(fn *v1alpha1.Function, pods []*corev1.Pod) []*corev1.Pod {
	if fn.Spec.Oneshot {
		return nil
	}
	want := callersDigest(&fn.Spec.Callers)
	var out []*corev1.Pod
	for _, p := range pods {
		if len(out) == reassignBatch {
			break
		}
		if p.Labels[v1alpha1.LabelFunction] == fn.Name && ownedBy(p, fn) && p.DeletionTimestamp == nil &&
			v1alpha1.PodReady(p) && p.Annotations[annCallers] != want {
			out = append(out, p)
		}
	}
	return out
}

// podWork is the pods a piece of background work is under way for, or
// was done for lately: start refuses a pod until its work is done and the
// pause done gave it has passed.
type podWork struct {
	mu   sync.Mutex
	pods map[types.UID]time.Time // until when start refuses the pod
}

// start claims uid for work at now; false while it is under way or
// resting.
func (r *podWork) start(uid types.UID, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if until, ok := r.pods[uid]; ok && now.Before(until) {
		return false
	}
	if r.pods == nil {
		r.pods = map[types.UID]time.Time{}
	}
	for u, until := range r.pods {
		if !now.Before(until) {
			delete(r.pods, u)
		}
	}
	r.pods[uid] = now.Add(24 * time.Hour) // under way
	return true
}

// done ends uid's work; start refuses it until until.
func (r *podWork) done(uid types.UID, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pods[uid] = until
}

// busy reports work under way or resting, for tests.
func (r *podWork) busy(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, until := range r.pods {
		if now.Before(until) {
			return true
		}
	}
	return false
}

// reassign hands fn's instances pods their callers again, in the
// background, one at a time per pod, and notes the callers on each pod
// once its instance took them. A failure is logged and tried again at a
// later tick (the pod still differs).
func (c *controller) reassign(fn *v1alpha1.Function, port int32, pods []*corev1.Pod) {
	digest := callersDigest(&fn.Spec.Callers)
	for _, pod := range pods {
		if !c.reassigning.start(pod.UID, time.Now()) {
			continue
		}
		c.wg.Go(func() {
			rest := time.Now().Add(reassignRest) // unless it lands
			defer func() { c.reassigning.done(pod.UID, rest) }()
			ctx, cancel := context.WithTimeout(c.runCtx, 2*c.cfg.AssignTimeout)
			defer cancel()
			if err := c.assignPod(ctx, pod, fn, port, ""); err != nil {
				c.log.Warn("assign again with the function's callers", "function", fn.Key(), "pod", pod.Name, "err", err, "retry_in", reassignRest.String())
				return
			}
			// Callers changed again while the assign was out: the next
			// tick hands over the newer ones; noting these would claim
			// the instance holds what it may not.
			if cur, err := c.cache.function(fn.Namespace, fn.Name); err != nil || callersDigest(&cur.Spec.Callers) != digest {
				rest = time.Time{}
				return
			}
			var v any = digest
			if digest == "" {
				v = nil // a merge patch's null removes it
			}
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
				"uid": pod.UID, "annotations": map[string]any{annCallers: v}}})
			if _, err := c.core.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				c.log.Warn("note the callers an instance holds", "function", fn.Key(), "pod", pod.Name, "err", err)
				return
			}
			rest = time.Time{}
			c.log.Info("instance assigned again with the function's callers", "function", fn.Key(), "pod", pod.Name, "callers", digest)
		})
	}
}
