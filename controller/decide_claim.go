package controller

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// claimCandidates returns the pool pods that may be claimed, best first:
// pods of the pool (label skipper.dev/pool=<pool>, no skipper.dev/function)
// that are Ready and not terminating, minus those in exclude (UIDs). Pods
// mine says the ring gives this replica come first (keyed by pod UID: any
// replica may assign any pool pod and the instance decides a race, so each
// takes another's only when it has none ready, and races stay rare; nil:
// no preference), then pods on preferNode (the caller's router runs there,
// so its calls stay on the node), then the longest Ready, then by name so
// the order is stable.
func claimCandidates(pool string, pods []*corev1.Pod, preferNode string, exclude map[string]bool, mine func(uid string) bool) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if p.Labels[v1alpha1.LabelPool] != pool {
			continue
		}
		if _, claimed := p.Labels[v1alpha1.LabelFunction]; claimed {
			continue
		}
		if !v1alpha1.PodReady(p) || exclude[string(p.UID)] {
			continue
		}
		out = append(out, p)
	}
	isMine := func(p *corev1.Pod) bool { return mine == nil || mine(string(p.UID)) }
	slices.SortStableFunc(out, func(a, b *corev1.Pod) int {
		if am, bm := isMine(a), isMine(b); am != bm {
			if am {
				return -1
			}
			return 1
		}
		an, bn := preferNode != "" && a.Spec.NodeName == preferNode, preferNode != "" && b.Spec.NodeName == preferNode
		if an != bn {
			if an {
				return -1
			}
			return 1
		}
		if c := readySince(a).Compare(readySince(b)); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return out
}

// claimAnnotations are the annotations a claim's record writes: when the
// instance accepted, its containers' restart count then, and for oneshot
// the router it is handed to.
func claimAnnotations(info claimInfo) map[string]string {
	ann := map[string]string{
		annClaimedAt:     info.At.UTC().Format(time.RFC3339Nano),
		annClaimRestarts: strconv.FormatInt(info.Restarts, 10),
	}
	if info.Router != "" {
		ann[annOneshotRouter] = info.Router
	}
	if info.Callers != "" {
		ann[annCallers] = info.Callers
	}
	return ann
}

// claimedCopy is pod as the record of its claim for fn will make it: the
// function label, the ownerReference and the claim annotations. It is what
// the controller assumes until the informer shows the record (issue 15:
// the instance decided the claim; the record follows).
func claimedCopy(pod *corev1.Pod, fn *v1alpha1.Function, info claimInfo) *corev1.Pod {
	p := pod.DeepCopy()
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels[v1alpha1.LabelFunction] = fn.Name
	p.OwnerReferences = append(p.OwnerReferences, functionOwnerRef(fn))
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	maps.Copy(p.Annotations, claimAnnotations(info))
	return p
}

// recordPatch builds the one JSON patch that records, on the pod as last
// read (cur), that its instance accepted fn: it adds the function label, a
// non-controller ownerReference to the Function (appending to
// ownerReferences, or creating the array when the pod has none) and the
// claim annotations.
//
// Its test ops check only what a claim must not overwrite: the same pod
// (UID), the labels as read (which proves skipper.dev/function absent: JSON
// patch cannot test absence) and the ownerReferences as read. They do not
// pin the resourceVersion: the kubelet's status writes move it on all
// the time, and the record of a claim the instance already decided must not
// fail on them. A write to labels or owners fails it; the recorder reads
// the pod again and decides anew.
//
// blockOwnerDeletion is true so a foreground deletion of the Function waits
// for its instances; setting it needs RBAC update on functions/finalizers
// where the OwnerReferencesPermissionEnforcement admission plugin is on.
func recordPatch(cur *corev1.Pod, fn *v1alpha1.Function, info claimInfo) ([]byte, error) {
	if cur.UID == "" {
		return nil, fmt.Errorf("pod %s/%s has no UID", cur.Namespace, cur.Name)
	}
	labels := cur.Labels
	if labels == nil {
		return nil, fmt.Errorf("pod %s/%s has no labels: not a pool pod", cur.Namespace, cur.Name)
	}
	ref := functionOwnerRef(fn)
	ops := []jsonPatchOp{
		{Op: "test", Path: "/metadata/uid", Value: string(cur.UID)},
		{Op: "test", Path: "/metadata/labels", Value: labels},
		{Op: "add", Path: "/metadata/labels/" + escapePointer(v1alpha1.LabelFunction), Value: fn.Name},
	}
	if len(cur.OwnerReferences) == 0 {
		// Nothing to test against (absence cannot be tested): add creates
		// the array, or replaces one written since, which the labels test
		// makes unlikely and the recorder's read-back would show.
		ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/ownerReferences", Value: []metav1.OwnerReference{ref}})
	} else {
		ops = append(ops,
			jsonPatchOp{Op: "test", Path: "/metadata/ownerReferences", Value: cur.OwnerReferences},
			jsonPatchOp{Op: "add", Path: "/metadata/ownerReferences/-", Value: ref})
	}
	ann := claimAnnotations(info)
	if len(cur.Annotations) == 0 {
		ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/annotations", Value: ann})
	} else {
		for _, k := range slices.Sorted(maps.Keys(ann)) {
			ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/annotations/" + escapePointer(k), Value: ann[k]})
		}
	}
	return json.Marshal(ops)
}

// recordState is what a pod as read says of the record of its claim for
// fn.
type recordState int

const (
	recordNeeded  recordState = iota // a pool pod not labelled for any function: write the record
	recordDone                       // labelled for fn and owned by it
	recordForeign                    // labelled for another function (or for fn without its owner): never overwrite
	recordPodGone                    // deleted, terminating, or another pod of that name
)

// recordStateOf decides what to do with the record of uid's claim for fn
// given the pod as read (nil: not found).
func recordStateOf(p *corev1.Pod, uid types.UID, fn *v1alpha1.Function) recordState {
	switch {
	case p == nil || p.UID != uid || p.DeletionTimestamp != nil:
		return recordPodGone
	case p.Labels[v1alpha1.LabelFunction] == "":
		return recordNeeded
	case p.Labels[v1alpha1.LabelFunction] == fn.Name && ownedBy(p, fn):
		return recordDone
	}
	return recordForeign
}

// assignPending reports whether the claimed pod still carries the
// assign-pending mark: nobody has recorded that its instance accepted.
func assignPending(p *corev1.Pod) bool {
	_, ok := p.Annotations[annAssignPending]
	return ok
}

// assignStale reports whether p's assignment was never recorded and no
// claim can still record it: still marked assign-pending grace after its
// claim (or with no claim time). The claimer's whole claim, assign and
// record take at most --claim-timeout plus --assign-timeout, so grace is
// that plus an --assign-timeout of margin for clocks and the informer.
func assignStale(p *corev1.Pod, now time.Time, grace time.Duration) bool {
	if !assignPending(p) {
		return false
	}
	at := claimedAt(p)
	return at.IsZero() || now.Sub(at) >= grace
}

// claimBudget is what bounds the claims a scale-up starts.
type claimBudget struct {
	// Missing is how many instances the function lacks: want less expected.
	Missing int
	// Candidates is how many pool pods a claim could take now.
	Candidates int
	// FunctionInFlight is how many claims of the function are in flight.
	FunctionInFlight int
	// InFlight is how many claims of all functions are in flight on this
	// replica, and MaxParallel how many may be (--max-parallel-claims).
	InFlight, MaxParallel int
}

// claimsToStart returns how many claims a scale-up starts now: the missing
// instances, but no more than the pool has candidates for and no more than
// MaxParallel leaves beside the claims in flight. With no candidate, one
// claim still starts when none of the function's is in flight: it waits
// for a pool pod (up to --claim-timeout), takes the first to become Ready,
// and reports the pool exhausted when none does. What is missing beyond
// the result is claimed on later ticks, so a function wanting 2^31
// instances costs no more than the bound.
func claimsToStart(b claimBudget) int {
	cands := b.Candidates
	if cands <= 0 && b.FunctionInFlight == 0 {
		cands = 1
	}
	return max(0, min(b.Missing, cands, b.MaxParallel-b.InFlight))
}
