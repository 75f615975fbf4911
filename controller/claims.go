package controller

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// claims is this replica's bookkeeping of its claims: the claims in flight
// (flights), the pool pods they are assigning (reserved), claimed pods the
// informer may not show yet (assumed), the claims whose record is being
// written (recording), pool pods whose instance said it holds a function
// (held), and pods withdrawn or deleted (retired). It does no I/O and
// starts no goroutine: the controller reads the caches, starts the claim
// of a flight this type registered, and reports how it ended (land).
//
// Lock order: controller.mu, then claims.mu, then poolStats.mu and the
// metrics; each may be taken alone. A supervisor's mu is never held while
// claims.mu is taken, nor the other way round. Nothing under claims.mu
// calls back into the controller but mine (a ring lookup, lock-free) and
// a join's admit (the caller's rate limiter, which takes no controller
// lock).
type claims struct {
	// mine says whether the ring gives this replica a pool pod (by UID),
	// to prefer it among candidates; nil: no preference. unrecorded, when
	// not nil, is set to the number of claims being recorded on every
	// change, under mu so the last change is the last write.
	mine       func(uid string) bool
	unrecorded prometheus.Gauge

	mu        sync.Mutex
	flights   map[string][]*flight    // claims in progress, by function key: expected instances
	assumed   map[string][]assumedPod // claims the informer may not show yet, by function key
	reserved  map[types.UID]bool      // pool pods a claim in flight is assigning
	recording map[types.UID]bool      // pods whose claim's record is being written (startRecord)
	// held: pool pods whose instance answered that it holds a function,
	// kept out of this replica's candidates until the time given.
	held    map[types.UID]time.Time
	retired map[types.UID]time.Time // withdrawn or deleted pods kept out of every set, until the time given
	// lastLag is how long the informer took to show the last claim it showed.
	lastLag time.Duration
}

type assumedPod struct {
	pod *corev1.Pod
	at  time.Time
}

// flight is one claim in progress; callers for the same function wait on
// done instead of claiming again. pod and err are set before done closes.
type flight struct {
	kind flightKind
	done chan struct{}
	pod  *corev1.Pod
	err  error
}

func newClaims(mine func(uid string) bool, unrecorded prometheus.Gauge) *claims {
	return &claims{
		mine:       mine,
		unrecorded: unrecorded,
		flights:    map[string][]*flight{},
		assumed:    map[string][]assumedPod{},
		reserved:   map[types.UID]bool{},
		recording:  map[types.UID]bool{},
		held:       map[types.UID]time.Time{},
		retired:    map[types.UID]time.Time{},
	}
}

// join returns the claim in flight for key and false or, when none is and
// admit (when not nil) lets it, a new cold flight and true: the caller
// starts its claim. admit's error is returned.
func (cl *claims) join(key string, admit func() error) (*flight, bool, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if fs := cl.flights[key]; len(fs) > 0 {
		return fs[0], false, nil
	}
	if admit != nil {
		if err := admit(); err != nil {
			return nil, false, err
		}
	}
	return cl.startLocked(key, flightCold), true, nil
}

// start registers a flight of kind for key; the caller starts its claim.
func (cl *claims) start(key string, kind flightKind) *flight {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.startLocked(key, kind)
}

// startLocked registers a flight: until it lands, it counts as an expected
// instance of key. cl.mu is held.
func (cl *claims) startLocked(key string, kind flightKind) *flight {
	f := &flight{done: make(chan struct{}), kind: kind}
	cl.flights[key] = append(cl.flights[key], f)
	return f
}

// land ends flight f of key. A pod it claimed becomes assumed in the same
// critical section, so the expectation is never dropped in between, and
// its reservation ends: until here the pod, which the informer may already
// show, counts as this flight. It does not close f.done: the caller sets
// f's outcome first.
func (cl *claims) land(key string, f *flight, pod *corev1.Pod, now time.Time) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.flights[key] = slices.DeleteFunc(cl.flights[key], func(o *flight) bool { return o == f })
	if len(cl.flights[key]) == 0 {
		delete(cl.flights, key)
	}
	if pod != nil {
		delete(cl.reserved, pod.UID)
		cl.assumed[key] = append(cl.assumed[key], assumedPod{pod: pod, at: now})
	}
}

// startScale registers the scale-up flights for fn towards want expected
// instances (see controller.scaleUp) and returns them; the caller starts
// their claims. pods and pool are cache reads (fn's pods, its pool's).
func (cl *claims) startScale(fn *v1alpha1.Function, pods, pool []*corev1.Pod, want, maxParallel int, now time.Time) []*flight {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	have := cl.expectedLocked(fn, pods, now)
	if want <= have {
		return nil
	}
	n := claimsToStart(claimBudget{
		Missing:          want - have,
		Candidates:       len(cl.candidatesLocked(fn, pool, "", nil, now)),
		FunctionInFlight: len(cl.flights[fn.Key()]),
		InFlight:         cl.inFlightLocked(),
		MaxParallel:      maxParallel,
	})
	if n == 0 {
		return nil
	}
	fs := make([]*flight, n)
	for i := range fs {
		fs[i] = cl.startLocked(fn.Key(), flightScale)
	}
	return fs
}

// inFlight counts the claims in flight for every function.
func (cl *claims) inFlight() int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.inFlightLocked()
}

func (cl *claims) inFlightLocked() int {
	n := 0
	for _, fs := range cl.flights {
		n += len(fs)
	}
	return n
}

// flying counts key's claims in flight.
func (cl *claims) flying(key string) int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return len(cl.flights[key])
}

// expectedLocked counts fn's expected instances: claimed pods the cache
// shows (not terminating, not withdrawn, not restarted), claims it does not
// show yet, and claims in flight. cl.mu is held; pods is a cache read taken
// before the lock, so a claim that ended in between is counted as assumed.
func (cl *claims) expectedLocked(fn *v1alpha1.Function, pods []*corev1.Pod, now time.Time) int {
	assumed := cl.assumedLocked(fn.Key(), pods, now)
	n := 0
	for _, p := range pods {
		// A pod a flight is claiming counts as that flight; one also
		// assumed (the cache shows it still marked assign-pending) counts
		// once, as assumed.
		if countsAsInstance(p, fn) && !cl.retiredLocked(p.UID, now) && !cl.reserved[p.UID] && !containsPod(assumed, p.UID) {
			n++
		}
	}
	for _, a := range assumed {
		if cl.retiredLocked(a.UID, now) {
			n-- // its record found it gone or another's (recordEnded)
		}
	}
	return n + len(assumed) + len(cl.flights[fn.Key()])
}

// reserve returns the best pool pod (from the cache read pool) for fn that
// no claim of this replica has taken or is taking and that is not in skip,
// and reserves it; nil when there is none.
func (cl *claims) reserve(fn *v1alpha1.Function, pool []*corev1.Pod, node string, skip map[string]bool, now time.Time) *corev1.Pod {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cands := cl.candidatesLocked(fn, pool, node, skip, now)
	if len(cands) == 0 {
		return nil
	}
	cl.reserved[cands[0].UID] = true
	return cands[0]
}

// unreserve ends the reservation of a pod whose claim failed.
func (cl *claims) unreserve(uid types.UID) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	delete(cl.reserved, uid)
}

// candidatesLocked returns the pool pods (from the cache read pool) a claim
// for fn may take, best first for node: ready, unclaimed, not in skip, not
// taken by a claim of this replica (assumed), being taken (reserved or
// recording), nor held at now (expired holds are forgotten). cl.mu is held.
func (cl *claims) candidatesLocked(fn *v1alpha1.Function, pool []*corev1.Pod, node string, skip map[string]bool, now time.Time) []*corev1.Pod {
	exclude := maps.Clone(skip)
	if exclude == nil {
		exclude = map[string]bool{}
	}
	for _, as := range cl.assumed {
		for _, a := range as {
			exclude[string(a.pod.UID)] = true
		}
	}
	for uid := range cl.reserved {
		exclude[string(uid)] = true
	}
	for uid := range cl.recording {
		exclude[string(uid)] = true
	}
	for uid, until := range cl.held {
		if now.After(until) {
			delete(cl.held, uid)
			continue
		}
		exclude[string(uid)] = true
	}
	return claimCandidates(fn.Spec.Pool, pool, node, exclude, cl.mine)
}

// hold keeps a pool pod whose instance holds a function out of this
// replica's candidates until until (never shortening a hold).
func (cl *claims) hold(uid types.UID, until time.Time) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if until.After(cl.held[uid]) {
		cl.held[uid] = until
	}
}

// retire keeps a pod this replica withdrew or is deleting out of every
// instance set until until (a drain's timeout, or assumedTTL after the
// delete, by when the informer shows the deletion), never shortening it.
func (cl *claims) retire(uid types.UID, until time.Time) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.retireLocked(uid, until)
}

func (cl *claims) retireLocked(uid types.UID, until time.Time) {
	if until.After(cl.retired[uid]) {
		cl.retired[uid] = until
	}
}

// retiredLocked reports whether uid is retired at now; cl.mu is held.
func (cl *claims) retiredLocked(uid types.UID, now time.Time) bool {
	until, ok := cl.retired[uid]
	return ok && now.Before(until)
}

// retiredUIDs returns the pods retired at now, forgetting those whose time
// has passed.
func (cl *claims) retiredUIDs(now time.Time) []string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var out []string
	for uid, until := range cl.retired {
		if !now.Before(until) {
			delete(cl.retired, uid)
			continue
		}
		out = append(out, string(uid))
	}
	return out
}

// assumedPods returns the claims of key the informer does not show yet
// (see assumedLocked).
func (cl *claims) assumedPods(key string, cached []*corev1.Pod, now time.Time) []*corev1.Pod {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.assumedLocked(key, cached, now)
}

// assumedLocked returns the claims of key the informer does not show in
// cached, or shows still marked assign-pending (the claim patch, not yet
// the record of the assignment that followed it), forgetting those it
// shows recorded (recording how long that took) and those older than
// assumedTTL whose record is not being written; cl.mu is held.
func (cl *claims) assumedLocked(key string, cached []*corev1.Pod, now time.Time) []*corev1.Pod {
	as := cl.assumed[key]
	if len(as) == 0 {
		return nil
	}
	var keep []assumedPod
	var out []*corev1.Pod
	for _, a := range as {
		if i := slices.IndexFunc(cached, func(p *corev1.Pod) bool { return p.UID == a.pod.UID }); i >= 0 && !assignPending(cached[i]) {
			cl.lastLag = now.Sub(a.at)
			continue
		}
		if now.Sub(a.at) > assumedTTL && !cl.recording[a.pod.UID] {
			// A claim whose record is still being written stays assumed
			// however long that takes (an API server outage): the instance
			// is the function's.
			continue
		}
		keep = append(keep, a)
		out = append(out, a.pod)
	}
	if len(keep) == 0 {
		delete(cl.assumed, key)
	} else {
		cl.assumed[key] = keep
	}
	return out
}

// forget drops what is assumed of key (its Function is gone, or owned
// elsewhere).
func (cl *claims) forget(key string) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	delete(cl.assumed, key)
}

// lag is the age at now of the oldest claim the informer does not show
// yet, or, with none outstanding, how long it took to show the last one.
func (cl *claims) lag(now time.Time) time.Duration {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	lag := cl.lastLag
	for _, as := range cl.assumed {
		for _, a := range as {
			lag = max(lag, now.Sub(a.at))
		}
	}
	return lag
}

// startRecording marks uid's record as being written; false when it is
// already.
func (cl *claims) startRecording(uid types.UID) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.recording[uid] {
		return false
	}
	cl.recording[uid] = true
	cl.setUnrecordedLocked()
	return true
}

// recordEnded updates what is assumed once the writer of uid's record (a
// claim of key) ended as st: a landed record starts the assumed pod's
// assumedTTL anew (the informer may take a while to show it after an
// outage, and until then the pod must stay the function's); a pod gone or
// recorded for another function leaves every set.
func (cl *claims) recordEnded(key string, uid types.UID, st recordState, now time.Time) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	delete(cl.recording, uid)
	switch st {
	case recordDone:
		for i := range cl.assumed[key] {
			if cl.assumed[key][i].pod.UID == uid {
				cl.assumed[key][i].at = now
			}
		}
	case recordPodGone, recordForeign:
		cl.assumed[key] = slices.DeleteFunc(cl.assumed[key], func(a assumedPod) bool { return a.pod.UID == uid })
		if len(cl.assumed[key]) == 0 {
			delete(cl.assumed, key)
		}
		cl.retireLocked(uid, now.Add(assumedTTL))
	}
	cl.setUnrecordedLocked()
}

func (cl *claims) setUnrecordedLocked() {
	if cl.unrecorded != nil {
		cl.unrecorded.Set(float64(len(cl.recording)))
	}
}

// unrecordedIn counts the pods of pool (its cache read poolPods; fnPods:
// the cached pods of each function that has assumed claims) that this
// replica knows hold a function, or may, while the informer does not show
// them recorded: assumed, reserved, held or recording.
func (cl *claims) unrecordedIn(pool string, poolPods []*corev1.Pod, fnPods map[string][]*corev1.Pod, now time.Time) int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	seen := map[types.UID]bool{}
	for k, cached := range fnPods {
		for _, p := range cl.assumedLocked(k, cached, now) {
			if p.Labels[v1alpha1.LabelPool] == pool {
				seen[p.UID] = true
			}
		}
	}
	for _, p := range poolPods {
		if _, held := cl.held[p.UID]; cl.reserved[p.UID] || cl.recording[p.UID] || held {
			seen[p.UID] = true
		}
	}
	return len(seen)
}

// assumedKeys returns the keys of the functions in namespace ns with
// assumed claims.
func (cl *claims) assumedKeys(ns string) []string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var out []string
	for k := range cl.assumed {
		if kns, _, _ := splitKey(k); kns == ns {
			out = append(out, k)
		}
	}
	return out
}

// claimView is what the claims hold about one function at one moment, as a
// supervisor's plan reads it.
type claimView struct {
	// Assumed are the claims the informer does not show yet (assumedLocked).
	Assumed []*corev1.Pod
	// Reserved are the cached pods a flight is claiming; Retired the
	// cached or assumed pods retired at the moment.
	Reserved, Retired []types.UID
	// InFlight counts the function's claims in flight.
	InFlight int
}

// view returns the claims of fn at now, pods being the cache's pods of fn,
// read before: one critical section, so a claim that lands meanwhile is
// seen once (as assumed).
func (cl *claims) view(key string, pods []*corev1.Pod, now time.Time) claimView {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	v := claimView{Assumed: cl.assumedLocked(key, pods, now), InFlight: len(cl.flights[key])}
	for _, p := range pods {
		if cl.reserved[p.UID] {
			v.Reserved = append(v.Reserved, p.UID)
		}
		if cl.retiredLocked(p.UID, now) {
			v.Retired = append(v.Retired, p.UID)
		}
	}
	for _, p := range v.Assumed {
		if cl.retiredLocked(p.UID, now) {
			v.Retired = append(v.Retired, p.UID)
		}
	}
	return v
}
