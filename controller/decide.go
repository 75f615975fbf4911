package controller

import (
	"cmp"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// This file holds the controller's decisions as pure functions of their
// inputs: no API calls, no clock, no goroutines. The loops elsewhere feed
// them informer state and carry out what they return.

// readySince is when the pod last became Ready (zero if unknown).
func readySince(p *corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// ownedBy reports whether p has an ownerReference to the Function with uid.
func ownedBy(p *corev1.Pod, fn *v1alpha1.Function) bool {
	for _, r := range p.OwnerReferences {
		if r.UID == fn.UID && r.Kind == functionKind {
			return true
		}
	}
	return false
}

// orphaned returns the pods, not yet terminating, that carry a function
// label but no Function ownerReference. A claim adds both in one patch, so
// such a pod is no function's instance, and the pool has released it: it
// would run forever. The garbage collector makes them: a Function deleted
// right after a claim, while the collector still sees the ReplicaSet's
// reference, gets its own reference stripped from the pod (the pod keeps a
// live owner) instead of the pod deleted; the ReplicaSet's release then
// leaves the pod owned by nothing.
func orphaned(pods []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp != nil || p.Labels[v1alpha1.LabelFunction] == "" {
			continue
		}
		if !slices.ContainsFunc(p.OwnerReferences, func(r metav1.OwnerReference) bool {
			return r.Kind == functionKind && strings.HasPrefix(r.APIVersion, v1alpha1.SchemeGroupVersion.Group+"/")
		}) {
			out = append(out, p)
		}
	}
	return out
}

// Instance states for skipper_controller_instances.
const (
	stateReady       = "ready"
	stateNotReady    = "not_ready"
	stateTerminating = "terminating"
	stateDraining    = "draining" // withdrawn from routers, waiting to be deleted
	stateClaiming    = "claiming" // a claim in flight
)

var instanceStates = []string{stateReady, stateNotReady, stateTerminating, stateDraining, stateClaiming}

// instance is one ready instance of a function, as handed to routers.
type instance struct {
	Pod     string
	UID     string
	Address string
	Node    string
}

// Annotations a claim writes on the pod (in the claim patch itself, so
// they are there from the moment the pod is an instance).
const (
	// annClaimedAt is when the pod was claimed (RFC 3339).
	annClaimedAt = "skipper.dev/claimed-at"
	// annClaimRestarts is the pod's container restart count at the claim:
	// a container that restarted since has lost its assignment.
	annClaimRestarts = "skipper.dev/claim-restarts"
	// annOneshotRouter names the router pod a oneshot instance was handed
	// to; only that router may release it.
	annOneshotRouter = "skipper.dev/oneshot-router"
	// annAssignPending marked a pod claimed before its instance was seen
	// accepting (the claim path before issue 15 patched first and
	// assigned after). Claims no longer write it: the record follows the
	// instance's acceptance. A pod still so marked (claimed by an older
	// controller that died between its patch and its assign) is in no
	// instance set, and its owner retires it (assignStale).
	annAssignPending = "skipper.dev/assign-pending"
)

// claimInfo is what a claim records on the pod.
type claimInfo struct {
	// At is when the instance accepted the assignment.
	At time.Time
	// Restarts is the pod's container restart count when the assign was
	// sent: a container that restarted since has lost its assignment.
	Restarts int64
	// Router is the router pod a oneshot instance is handed to; empty for
	// shared instances.
	Router string
	// Callers is the digest of the callers the assign handed the instance
	// (callersDigest; "": none).
	Callers string
}

// restarts sums the restart counts of the pod's containers, its init
// containers' included: a native sidecar (skipper-agent) that restarted
// lost the assignment as surely as the application.
func restarts(p *corev1.Pod) int64 {
	var n int64
	for _, ss := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range ss {
			n += int64(cs.RestartCount)
		}
	}
	return n
}

// restartedSinceClaim reports whether a container of the claimed pod
// restarted after the claim: the process that held the assignment is gone.
func restartedSinceClaim(p *corev1.Pod) bool {
	v, ok := p.Annotations[annClaimRestarts]
	if !ok {
		return false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return err == nil && restarts(p) > n
}

// claimedAt is when the pod was claimed, or zero if it does not say.
func claimedAt(p *corev1.Pod) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, p.Annotations[annClaimedAt])
	return t
}

// victim is an instance that a scale-down may withdraw.
type victim struct {
	Pod       *corev1.Pod
	Ready     bool
	InFlight  int64
	ClaimedAt time.Time
}

// pickVictims returns the n instances a scale-down withdraws: not ready
// first (they serve nothing), then the least loaded (the shortest drain),
// then the most recently claimed (HPA removes the youngest), then by name.
func pickVictims(cands []victim, n int) []victim {
	if n <= 0 {
		return nil
	}
	out := slices.Clone(cands)
	slices.SortFunc(out, func(a, b victim) int {
		if a.Ready != b.Ready {
			if !a.Ready {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(a.InFlight, b.InFlight); c != 0 {
			return c
		}
		if c := b.ClaimedAt.Compare(a.ClaimedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.Pod.Name, b.Pod.Name)
	})
	return out[:min(n, len(out))]
}

// instanceSet returns the function's ready instances, sorted by pod name:
// pods labelled with the function's name, owned by this Function (same UID,
// so a re-created Function never inherits its predecessor's pods), Ready,
// not terminating, and not marked assign-pending. assumed are pods this
// replica claimed and saw accept their assignment that the informer may
// not show yet, or shows still marked; a pod in both is taken from pods
// (the informer is newer once it shows the label) unless pods shows it
// marked, when this replica's own record of the assign stands. Pods whose
// UID is in unusable are left out, and so are pods whose container
// restarted since the claim. A oneshot function has no shared set: each of
// its instances belongs to one call.
func instanceSet(fn *v1alpha1.Function, port int32, pods, assumed []*corev1.Pod, unusable []string) []instance {
	if fn.Spec.Oneshot {
		return nil
	}
	seen := map[string]bool{}
	var out []instance
	add := func(p *corev1.Pod) {
		if seen[string(p.UID)] || assignPending(p) {
			// A marked pod is not seen: an assumed copy may stand in.
			return
		}
		seen[string(p.UID)] = true
		if p.Namespace != fn.Namespace || p.Labels[v1alpha1.LabelFunction] != fn.Name || !ownedBy(p, fn) ||
			!v1alpha1.PodReady(p) || restartedSinceClaim(p) || slices.Contains(unusable, string(p.UID)) {
			return
		}
		out = append(out, instance{
			Pod:     p.Name,
			UID:     string(p.UID),
			Address: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port))),
			Node:    p.Spec.NodeName,
		})
	}
	for _, p := range pods {
		add(p)
	}
	for _, p := range assumed {
		add(p)
	}
	slices.SortFunc(out, func(a, b instance) int { return cmp.Compare(a.Pod, b.Pod) })
	return out
}

// sameInstances reports whether two sorted sets hold the same pods at the
// same addresses.
func sameInstances(a, b []instance) bool { return slices.Equal(a, b) }

const functionKind = "Function"

// jsonPatchOp is one RFC 6902 operation.
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// escapePointer escapes a JSON pointer reference token (RFC 6901).
func escapePointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

func functionOwnerRef(fn *v1alpha1.Function) metav1.OwnerReference {
	f, t := false, true
	return metav1.OwnerReference{
		APIVersion:         v1alpha1.SchemeGroupVersion.String(),
		Kind:               functionKind,
		Name:               fn.Name,
		UID:                fn.UID,
		Controller:         &f,
		BlockOwnerDeletion: &t,
	}
}

// instancePort is the port a function's instances serve on: spec.port, or
// the pool template's first container port.
func instancePort(fn *v1alpha1.Function, pool *appsv1.Deployment) (int32, error) {
	if fn.Spec.Port > 0 {
		return fn.Spec.Port, nil
	}
	if port := v1alpha1.FirstPort(&pool.Spec.Template.Spec); port > 0 {
		return port, nil
	}
	return 0, fmt.Errorf("%w: function %s sets no port and pool Deployment %s/%s's first container declares none",
		ErrNoPort, fn.Key(), pool.Namespace, pool.Name)
}

// poolDeployment picks the pool's Deployment among those labelled with it:
// the oldest live one, by name on ties, so every replica picks the same.
func poolDeployment(ds []*appsv1.Deployment) *appsv1.Deployment {
	var best *appsv1.Deployment
	for _, d := range ds {
		if d.DeletionTimestamp != nil {
			continue
		}
		if best == nil || d.CreationTimestamp.Before(&best.CreationTimestamp) ||
			(d.CreationTimestamp.Equal(&best.CreationTimestamp) && d.Name < best.Name) {
			best = d
		}
	}
	return best
}

// nextGeneration returns the generation following prev at now. Generations
// are seeded from the clock (Unix microseconds) and strictly increase, so a
// replica that restarts, or takes over a function, continues above what
// routers hold from its predecessor as long as clocks differ by less than
// the time between two changes.
func nextGeneration(prev uint64, now time.Time) uint64 {
	return max(prev+1, uint64(now.UnixMicro()))
}
