package controller

import (
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/scaling"
)

// Bounds of what poolStats keeps per pool.
const (
	// maxPoolWindow is the longest skipper.dev/pool-window: claims older
	// than it are dropped.
	maxPoolWindow = 10 * time.Minute
	// maxPoolClaims bounds the claims kept per pool; at the bound the
	// oldest tenth goes (a claim rate of more than this per window reads
	// as this).
	maxPoolClaims = 10_000
	// maxPoolOrders bounds the pods a pool is waiting for (claims' and
	// scale-ups' replacements) that a pod start is timed from, and
	// maxOrderAge how long one is waited for: a pod not started by then is
	// not coming for that order (its ReplicaSet was scaled down, or a pod
	// this replica did not see started first).
	maxPoolOrders = 1000
	maxOrderAge   = 2 * time.Minute
	// maxRecordDelay is the longest claim-to-record delay a replacement's
	// start is timed from the claim over; a record later than that is
	// timed from when it was seen.
	maxRecordDelay = 5 * time.Second
	// readySamples is how many of a pool's latest pod starts its ready
	// time is taken from: their third quartile (readyQuantile), so a pool
	// is sized for its slower starts, not its typical one.
	readySamples  = 16
	readyQuantile = 0.75
	// writtenTrust is how long the replicas this replica patched are taken
	// over the informer's older view of them.
	writtenTrust = 5 * time.Second
)

// poolStats is what the pool autoscaler measures, from every replica's own
// claims and from pod events (so another replica's claims count once its
// record lands). It has its own lock, taken after c.mu or alone, never
// before it.
type poolStats struct {
	mu    sync.Mutex
	pools map[string]*poolRecord // by "namespace/pool"
}

// poolRecord is one pool's claims, pod starts and decisions.
//
// A pod start is timed from what asked for the pod, oldest first: a
// claim (its replacement comes once its record is seen: the ReplicaSet
// replaces the pod it no longer matches) or a scale-up, to a pod seen
// created and then ready; with nothing asked for, from when it was seen
// created. So the ready time is how long a claim keeps its slot of the
// pool from the next claim (the record's delay, the ReplicaSet's and the
// scheduler's reaction and the pod's own start), and what a claim waits
// for when the pool is empty. Claims in the informer's
// first list ask for nothing: their replacements started before this
// replica watched. A pod nothing asked for, born between a claim and its
// record seen, takes the claim's order (the oldest goes to the first pod
// ready): its start reads long and the real replacement's short, by as
// much, which the quantile over 16 starts bears.
type poolRecord struct {
	claims  map[types.UID]time.Time // when each pod was claimed, for the rate
	ordered map[types.UID]bool      // claimed pods whose record was seen (and asked for its replacement)
	orders  []time.Time             // pods asked for and not yet ready, oldest first
	born    map[types.UID]time.Time // pool pods seen created, not yet ready
	ready   []time.Duration         // the latest pod starts' time to ready, oldest first
	// recent is the demand of the latest decisions within the window,
	// each above every later one (a lower one before a higher one can
	// never hold anything), so it stays short.
	recent     []scaling.PoolPoint
	lastUp     time.Time // the latest scale-up
	ownedSince time.Time // since when this replica owns the pool; zero: it does not
	written    struct {  // the replicas this replica last patched
		n  int32
		at time.Time
	}
}

func (s *poolStats) record(key string) *poolRecord {
	if s.pools == nil {
		s.pools = map[string]*poolRecord{}
	}
	r := s.pools[key]
	if r == nil {
		r = &poolRecord{claims: map[types.UID]time.Time{}, ordered: map[types.UID]bool{}, born: map[types.UID]time.Time{}}
		s.pools[key] = r
	}
	return r
}

// claimed notes that pod uid of pool key was claimed at at (observed at
// now). A claim seen twice (this replica's own, then its record) counts
// once; one older than any window is not kept.
func (s *poolStats) claimed(key string, uid types.UID, at, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.record(key).claim(uid, at, now)
}

func (r *poolRecord) claim(uid types.UID, at, now time.Time) {
	if _, ok := r.claims[uid]; ok || at.Before(now.Add(-maxPoolWindow)) {
		return
	}
	if len(r.claims) >= maxPoolClaims {
		r.trim(now.Add(-maxPoolWindow))
	}
	if len(r.claims) >= maxPoolClaims {
		// Still full: drop the oldest tenth, so the newest claims count.
		ts := make([]time.Time, 0, len(r.claims))
		for _, t := range r.claims {
			ts = append(ts, t)
		}
		slices.SortFunc(ts, time.Time.Compare)
		r.trim(ts[len(ts)/10].Add(time.Nanosecond))
	}
	r.claims[uid] = at
}

// order notes that n pods were asked for at at.
func (r *poolRecord) order(at time.Time, n int) {
	for range n {
		if len(r.orders) >= maxPoolOrders {
			r.orders = r.orders[1:]
		}
		i, _ := slices.BinarySearchFunc(r.orders, at, time.Time.Compare)
		r.orders = slices.Insert(r.orders, i, at)
	}
}

// scaled notes that this replica changed pool key's replicas from old to n
// at at: a scale-up asks for the new pods; a scale-down cancels as many
// of the newest requests (pods it removes before they start are never
// ready). The informer's view of the replicas lags the write: until it
// catches up (or writtenTrust passes), written says what they are.
func (s *poolStats) scaled(key string, at time.Time, old, n int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.record(key)
	r.written.n, r.written.at = n, at
	if delta := int(n) - int(old); delta > 0 {
		r.order(at, delta)
		r.lastUp = at
	} else {
		r.orders = r.orders[:max(len(r.orders)+delta, 0)]
	}
}

// replicas is the pool's current replicas: cached, unless this replica
// wrote another count within writtenTrust that the cache does not show
// yet.
func (s *poolStats) replicas(key string, cached int32, now time.Time) int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.pools[key]
	if r == nil || r.written.at.IsZero() || r.written.n == cached || now.Sub(r.written.at) > writtenTrust {
		return cached
	}
	return r.written.n
}

// decided keeps a decision's demand for the next decisions: those older
// than window go, and so do earlier ones it is not below.
func (s *poolStats) decided(key string, at time.Time, demand int32, window time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.record(key)
	r.recent = slices.DeleteFunc(r.recent, func(p scaling.PoolPoint) bool {
		return p.At.Before(at.Add(-window)) || p.Replicas <= demand
	})
	r.recent = append(r.recent, scaling.PoolPoint{At: at, Replicas: demand})
}

// owned notes that this replica owns pool key at now, and reports since
// when; the first time, the count it found (replicas) is kept as if
// decided then, so a new owner waits a window before it scales down (its
// predecessor's decisions are not known here).
func (s *poolStats) owned(key string, now time.Time, replicas int32) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.record(key)
	if r.ownedSince.IsZero() {
		r.ownedSince = now
		r.recent = append(r.recent, scaling.PoolPoint{At: now, Replicas: replicas})
	}
	return r.ownedSince
}

// disowned notes that this replica does not own pool key (any more).
func (s *poolStats) disowned(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.pools[key]; r != nil {
		r.ownedSince, r.recent, r.written.at = time.Time{}, nil, time.Time{}
	}
}

// trim drops the claims before from.
func (r *poolRecord) trim(from time.Time) {
	for uid, t := range r.claims {
		if t.Before(from) {
			delete(r.claims, uid)
		}
	}
}

// observe takes one pod event at now. live says the informer saw it while
// watching (an update, or an add not in its first list).
func (s *poolStats) observe(p *corev1.Pod, now time.Time, live bool) {
	pool, ok := p.Labels[v1alpha1.LabelPool]
	if !ok {
		return
	}
	key := p.Namespace + "/" + pool
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.record(key)
	if _, fn := p.Labels[v1alpha1.LabelFunction]; fn {
		claimed := claimedAt(p)
		if !claimed.IsZero() {
			r.claim(p.UID, claimed, now)
		}
		if !r.ordered[p.UID] {
			r.ordered[p.UID] = true
			if live {
				// The record is in: the ReplicaSet makes its replacement.
				// The claim's slot was taken at the claim, not here, so
				// its replacement is timed from the claim: the record's
				// delay counts, up to maxRecordDelay (a longer one is
				// an outage of the API server, not the pool's pace; a
				// claim after now is another replica's clock ahead).
				at := now
				if claimed.Before(now) && !claimed.Before(now.Add(-maxRecordDelay)) {
					at = claimed
				}
				r.order(at, 1)
			}
		}
		delete(r.born, p.UID)
		return
	}
	if live && !v1alpha1.PodReady(p) {
		ct := p.CreationTimestamp.Time // a pod made long ago, first seen now (after a restart), is not a start to time
		if _, ok := r.born[p.UID]; !ok && (ct.IsZero() || ct.After(now.Add(-maxOrderAge))) {
			r.born[p.UID] = now
		}
		return
	}
	born, ok := r.born[p.UID]
	if !ok || !v1alpha1.PodReady(p) {
		return
	}
	delete(r.born, p.UID)
	for len(r.orders) > 0 && r.orders[0].Before(now.Add(-maxOrderAge)) {
		r.orders = r.orders[1:]
	}
	from := born
	if len(r.orders) > 0 && r.orders[0].Before(born) {
		from, r.orders = r.orders[0], r.orders[1:]
	}
	if len(r.ready) == readySamples {
		r.ready = r.ready[1:]
	}
	r.ready = append(r.ready, now.Sub(from))
}

// forget drops pod uid of pool key: it was deleted.
func (s *poolStats) forget(key string, uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.pools[key]; r != nil {
		delete(r.born, uid)
		delete(r.ordered, uid)
	}
}

// poolSnapshot is what the pool autoscaler decides from, of one pool.
type poolSnapshot struct {
	claims    []time.Time         // within the window asked for
	readyTime time.Duration       // the measured pod starts' readyQuantile; 0: none measured
	recent    []scaling.PoolPoint // the latest decisions' demand
	lastUp    time.Time           // the latest scale-up
	asked     []time.Time         // when the pods on their way were asked for
}

// snapshot returns pool key's figures, the claims since now-window
// (dropping those older than any window).
func (s *poolStats) snapshot(key string, now time.Time, window time.Duration) poolSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.pools[key]
	if r == nil {
		return poolSnapshot{}
	}
	snap := poolSnapshot{recent: slices.Clone(r.recent), lastUp: r.lastUp}
	for _, t := range r.orders {
		if !t.Before(now.Add(-maxOrderAge)) {
			snap.asked = append(snap.asked, t)
		}
	}
	r.trim(now.Add(-maxPoolWindow))
	from := now.Add(-window)
	for _, t := range r.claims {
		if !t.Before(from) {
			snap.claims = append(snap.claims, t)
		}
	}
	if len(r.ready) > 0 {
		rs := slices.Clone(r.ready)
		slices.Sort(rs)
		snap.readyTime = rs[int(float64(len(rs)-1)*readyQuantile+0.5)]
	}
	return snap
}

// drop forgets pool key (its Deployment is gone).
func (s *poolStats) drop(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pools, key)
}
