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
	// maxPoolClaims bounds the claims kept per pool (a claim rate of more
	// than this per window reads as this).
	maxPoolClaims = 10_000
	// maxPoolOrders bounds the pods a pool is waiting for (claims' and
	// scale-ups' replacements) that a pod start is timed from.
	maxPoolOrders = 1000
	// readySamples is how many of a pool's latest pod starts its ready
	// time is the median of.
	readySamples = 16
)

// poolStats is what the pool autoscaler measures, from every replica's own
// claims and from pod events (so another replica's claims count once its
// record lands, and an ownership move loses nothing this replica saw). It
// has its own lock, taken after c.mu or alone, never before it.
type poolStats struct {
	mu    sync.Mutex
	pools map[string]*poolRecord // by "namespace/pool"
}

// poolRecord is one pool's claims and pod starts.
//
// A pod start is timed from what asked for the pod: a claim (the
// ReplicaSet replaces the claimed pod once its record lands) or a
// scale-up, oldest first, to a pod seen created and then ready; with
// nothing asked for, from when it was seen created. So the ready time
// holds what a claim waits for when the pool is empty: the record, the
// ReplicaSet's and the scheduler's reaction, and the pod's own start.
type poolRecord struct {
	claims map[types.UID]time.Time // when each pod was claimed
	orders []time.Time             // pods asked for and not yet ready, oldest first
	born   map[types.UID]time.Time // pool pods seen created, not yet ready
	ready  []time.Duration         // the latest pod starts' time to ready, oldest first
	recent []scaling.PoolPoint     // the demand of the latest decisions
	lastUp time.Time               // the latest scale-up
}

func (s *poolStats) record(key string) *poolRecord {
	if s.pools == nil {
		s.pools = map[string]*poolRecord{}
	}
	r := s.pools[key]
	if r == nil {
		r = &poolRecord{claims: map[types.UID]time.Time{}, born: map[types.UID]time.Time{}}
		s.pools[key] = r
	}
	return r
}

// claimed notes that pod uid of pool key was claimed at at. A claim seen
// twice (this replica's own, then its record) counts once.
func (s *poolStats) claimed(key string, uid types.UID, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.record(key)
	if _, ok := r.claims[uid]; ok {
		return
	}
	if len(r.claims) >= maxPoolClaims {
		r.trim(at.Add(-maxPoolWindow))
		if len(r.claims) >= maxPoolClaims {
			return
		}
	}
	r.claims[uid] = at
	r.order(at, 1)
}

// order notes that n pods were asked for at at.
func (r *poolRecord) order(at time.Time, n int) {
	for range n {
		if len(r.orders) >= maxPoolOrders {
			r.orders = r.orders[1:]
		}
		i, _ := slices.BinarySearchFunc(r.orders, at, time.Time.Compare) // a late record's claim is older than some
		r.orders = slices.Insert(r.orders, i, at)
	}
}

// scaled notes that pool key's replicas changed by delta at at: a
// scale-up asks for delta pods; a scale-down cancels as many of the
// newest requests (pods it removes before they start are never ready).
func (s *poolStats) scaled(key string, at time.Time, delta int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.record(key)
	if delta >= 0 {
		r.order(at, delta)
		if delta > 0 {
			r.lastUp = at
		}
		return
	}
	r.orders = r.orders[:max(len(r.orders)+delta, 0)]
}

// decided keeps a decision's demand for the next decisions; those older
// than window go, and a demand the same as the last one moves it to at.
func (s *poolStats) decided(key string, at time.Time, demand int32, window time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.record(key)
	r.recent = slices.DeleteFunc(r.recent, func(p scaling.PoolPoint) bool { return p.At.Before(at.Add(-window)) })
	if n := len(r.recent); n > 0 && r.recent[n-1].Replicas == demand {
		r.recent[n-1].At = at
		return
	}
	r.recent = append(r.recent, scaling.PoolPoint{At: at, Replicas: demand})
}

// trim drops the claims before from.
func (r *poolRecord) trim(from time.Time) {
	for uid, t := range r.claims {
		if t.Before(from) {
			delete(r.claims, uid)
		}
	}
}

// observe takes one pod event at now. created says the informer saw the
// pod appear while watching (not in its first list), so the time from
// then to its readiness is a pod start measured here.
func (s *poolStats) observe(p *corev1.Pod, now time.Time, created bool) {
	pool, ok := p.Labels[v1alpha1.LabelPool]
	if !ok {
		return
	}
	key := p.Namespace + "/" + pool
	if _, fn := p.Labels[v1alpha1.LabelFunction]; fn {
		if at, err := time.Parse(time.RFC3339Nano, p.Annotations[annClaimedAt]); err == nil {
			s.claimed(key, p.UID, at)
		}
		s.forget(key, p.UID)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.record(key)
	if created && !podReady(p) {
		r.born[p.UID] = now
		return
	}
	born, ok := r.born[p.UID]
	if !ok || !podReady(p) {
		return
	}
	delete(r.born, p.UID)
	// Orders older than the longest window were met by pods this replica
	// did not see start, or never will be.
	for len(r.orders) > 0 && r.orders[0].Before(now.Add(-maxPoolWindow)) {
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

// forget drops pod uid's start, if it was being timed (deleted, or
// claimed before it was ready).
func (s *poolStats) forget(key string, uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.pools[key]; r != nil {
		delete(r.born, uid)
	}
}

// poolSnapshot is what the pool autoscaler decides from, of one pool.
type poolSnapshot struct {
	claims    []time.Time         // within the window asked for
	readyTime time.Duration       // the median measured pod start; 0: none measured
	recent    []scaling.PoolPoint // the latest decisions' demand
	lastUp    time.Time           // the latest scale-up
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
		snap.readyTime = rs[len(rs)/2]
	}
	return snap
}

// drop forgets pool key (its Deployment is gone).
func (s *poolStats) drop(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pools, key)
}
