package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/scaling"
	"skipper.dev/skipper/internal/poll"
)

func TestPoolStats(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	var s poolStats
	const key = "default/echo"
	s.claimed(key, "a", now.Add(-time.Second), now)
	s.claimed(key, "a", now, now) // its record, seen later: counts once
	s.claimed(key, "old", now.Add(-time.Minute), now)
	s.claimed(key, "ancient", now.Add(-time.Hour), now) // older than any window: not kept

	// A claim made by another replica shows as its record.
	rec := poolPod("b", "echo", claimedBy(testFunction("hello")))
	rec.Annotations = map[string]string{annClaimedAt: now.Add(-2 * time.Second).Format(time.RFC3339Nano)}
	s.observe(rec, now, false)
	// A pod of another pool, and one without a pool, are not this pool's.
	s.observe(poolPod("c", "other", claimedBy(testFunction("x"))), now, false)
	s.observe(testPod("d"), now, false)

	snap := s.snapshot(key, now, 30*time.Second)
	claims, ready := snap.claims, snap.readyTime
	if len(claims) != 2 {
		t.Errorf("claims in 30s: %v, want a and b", claims)
	}
	if ready != 0 {
		t.Errorf("ready time %s with no pod start seen, want 0", ready)
	}
	if claims := s.snapshot(key, now, 90*time.Second).claims; len(claims) != 3 {
		t.Errorf("claims in 90s: %d, want 3", len(claims))
	}

	// Pod starts, with nothing asked for: from seen created (not ready)
	// to ready. A pod in the first list, or one already ready when seen,
	// is not timed.
	s = poolStats{}
	for i, d := range []time.Duration{300, 100, 200} {
		p := poolPod(fmt.Sprint("s", i), "echo", notReady)
		s.observe(p, now, true)
		p = poolPod(fmt.Sprint("s", i), "echo")
		s.observe(p, now.Add(d*time.Millisecond), false)
		s.observe(p, now.Add(time.Hour), false) // later updates change nothing
	}
	s.observe(poolPod("listed", "echo", notReady), now, false)
	s.observe(poolPod("listed", "echo"), now.Add(time.Hour), false)
	s.observe(poolPod("born-ready", "echo"), now, true)
	s.observe(poolPod("born-ready", "echo"), now.Add(time.Hour), false)
	// One claimed before it turned ready, and one deleted: forgotten.
	s.observe(poolPod("claimed-early", "echo", notReady), now, true)
	s.observe(poolPod("claimed-early", "echo", claimedBy(testFunction("hello"))), now.Add(time.Hour), false)
	s.observe(poolPod("gone", "echo", notReady), now, true)
	s.forget(key, "uid-gone")
	if ready := s.snapshot(key, now, 30*time.Second).readyTime; ready != 300*time.Millisecond {
		t.Errorf("ready time %s, want the third quartile 300ms", ready)
	}
	if n := len(s.pools[key].born); n != 0 {
		t.Errorf("%d pod starts still being timed, want 0", n)
	}
	// The third quartile of 16 distinct starts, 1..16 × 100ms: the 12th.
	s = poolStats{}
	for i := range readySamples {
		p := poolPod(fmt.Sprint("q", i), "echo", notReady)
		s.observe(p, now, true)
		s.observe(poolPod(fmt.Sprint("q", i), "echo"), now.Add(time.Duration(readySamples-i)*100*time.Millisecond), false)
	}
	if ready := s.snapshot(key, now, 30*time.Second).readyTime; ready != 1200*time.Millisecond {
		t.Errorf("ready time %s of 100ms..1.6s, want the third quartile 1.2s", ready)
	}
	// Only the latest starts count.
	for i := range 2 * readySamples {
		p := poolPod(fmt.Sprint("t", i), "echo", notReady)
		s.observe(p, now, true)
		s.observe(poolPod(fmt.Sprint("t", i), "echo"), now.Add(time.Second), false)
	}
	if ready := s.snapshot(key, now, 30*time.Second).readyTime; ready != time.Second || len(s.pools[key].ready) != readySamples {
		t.Errorf("ready time %s over %d samples, want 1s over %d", ready, len(s.pools[key].ready), readySamples)
	}
	s.drop(key)
	if snap := s.snapshot(key, now, 30*time.Second); snap.claims != nil || snap.readyTime != 0 {
		t.Errorf("a dropped pool still has %+v", snap)
	}
}

func TestPoolStatsTimesStartsFromWhatAskedForThem(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	var s poolStats
	const key = "default/echo"
	start := func(name string, born, ready time.Duration) {
		s.observe(poolPod(name, "echo", notReady), now.Add(born), true)
		s.observe(poolPod(name, "echo"), now.Add(ready), true)
	}
	// recorded: a claim made at claimed, its record seen at seen.
	recorded := func(name string, claimed, seen time.Duration, live bool) {
		p := poolPod(name, "echo", claimedBy(testFunction("hello")))
		p.Annotations = map[string]string{annClaimedAt: now.Add(claimed).Format(time.RFC3339Nano)}
		s.observe(p, now.Add(seen), live)
	}
	// Claims in the informer's first list ask for nothing: their
	// replacements started before this replica watched (a restart).
	for i := range 40 {
		at := -time.Duration(i) * time.Minute / 5
		recorded(fmt.Sprint("before-", i), at, at, false)
	}
	// A claim's replacement is timed from the claim, not from its record
	// seen: the slot was taken at the claim.
	s.claimed(key, "own", now, now)                                // this replica's own claim: the rate now, the order when its record is seen
	recorded("own", 0, 200*time.Millisecond, true)                 // its replacement: 2s
	s.scaled(key, now.Add(500*time.Millisecond), 3, 5)             // two more: 1.5s, 1.5s
	recorded("other", -time.Second, 0, true)                       // another replica's, claimed 1s earlier: the oldest order, 3s
	recorded("own", 0, time.Second, true)                          // seen again: asks for nothing more
	recorded("outage", -time.Hour, 1500*time.Millisecond, true)    // recorded after an outage: ordered when its record is seen
	recorded("ahead", 10*time.Second, 1500*time.Millisecond, true) // claimed by a clock ahead of this one: ordered when seen
	for i := range 4 {
		start(fmt.Sprint("r", i), 1500*time.Millisecond, 2*time.Second)
	}
	start("spare", 2*time.Second, 2100*time.Millisecond)  // the outage's replacement: from its record seen, 600ms
	start("spare2", 2*time.Second, 2100*time.Millisecond) // the clock-ahead claim's replacement: from its record seen, 600ms
	start("spare3", 2*time.Second, 2100*time.Millisecond) // nothing asked for it: seen created → ready
	want := []time.Duration{3 * time.Second, 2 * time.Second, 1500 * time.Millisecond, 1500 * time.Millisecond, 600 * time.Millisecond, 600 * time.Millisecond, 100 * time.Millisecond}
	if got := s.pools[key].ready; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pod starts %v, want %v", got, want)
	}
	// A scale-down cancels the newest requests; an order older than
	// maxOrderAge is dropped unmet.
	s.scaled(key, now.Add(3*time.Second), 5, 8)
	s.scaled(key, now.Add(4*time.Second), 8, 6)
	if n := len(s.pools[key].orders); n != 1 {
		t.Errorf("%d pods asked for, want 1", n)
	}
	if asked := s.snapshot(key, now.Add(4*time.Second), time.Minute).asked; len(asked) != 1 || !asked[0].Equal(now.Add(3*time.Second)) {
		t.Errorf("pods on their way asked at %v in the snapshot, want one at +3s", asked)
	}
	if asked := s.snapshot(key, now.Add(3*time.Second+maxOrderAge+time.Millisecond), time.Minute).asked; len(asked) != 0 {
		t.Errorf("pods on their way asked at %v after maxOrderAge, want none", asked)
	}
	if up := s.snapshot(key, now, time.Minute).lastUp; !up.Equal(now.Add(3 * time.Second)) {
		t.Errorf("last scale-up at %s, want +3s", up)
	}
	start("late", maxOrderAge+5*time.Second, maxOrderAge+6*time.Second)
	if got := s.pools[key].ready; got[len(got)-1] != time.Second {
		t.Errorf("a start after the order expired timed %s, want 1s from its creation", got[len(got)-1])
	}
	// A pod made long ago and first seen now is not a start.
	old := poolPod("old", "echo", notReady)
	old.CreationTimestamp = metav1.NewTime(now.Add(-time.Hour))
	s.observe(old, now, true)
	if _, ok := s.pools[key].born[old.UID]; ok {
		t.Error("a pod created an hour ago is timed as a start")
	}

	// The replicas this replica wrote are taken over the cache's older
	// view for writtenTrust.
	if got := s.replicas(key, 8, now.Add(5*time.Second)); got != 6 {
		t.Errorf("replicas %d just after writing 6, the cache showing 8", got)
	}
	if got := s.replicas(key, 8, now.Add(4*time.Second+writtenTrust+time.Millisecond)); got != 8 {
		t.Errorf("replicas %d after writtenTrust, want the cache's 8", got)
	}

	// A decision's demand is kept for the window, and only while no later
	// one is as high.
	s.decided(key, now, 9, 10*time.Second)
	s.decided(key, now.Add(time.Second), 4, 10*time.Second)
	s.decided(key, now.Add(2*time.Second), 9, 10*time.Second)
	s.decided(key, now.Add(3*time.Second), 5, 10*time.Second)
	s.decided(key, now.Add(13*time.Second), 3, 10*time.Second)
	recent := s.snapshot(key, now.Add(13*time.Second), 10*time.Second).recent
	if fmt.Sprint(recent) != fmt.Sprint([]scaling.PoolPoint{{At: now.Add(3 * time.Second), Replicas: 5}, {At: now.Add(13 * time.Second), Replicas: 3}}) {
		t.Errorf("recent %v, want 5 at +3s and 3 at +13s", recent)
	}
	for i := range 5000 {
		s.decided(key, now.Add(time.Duration(i)*time.Millisecond), int32(5+i%2), time.Minute)
	}
	if n := len(s.pools[key].recent); n > 2 {
		t.Errorf("%d decisions kept of a demand alternating 5 and 6, want at most 2", n)
	}

	// A new owner holds what it found for a window; ownership lost
	// forgets that.
	if since := s.owned(key, now, 12); !since.Equal(now) {
		t.Errorf("owned since %s", since)
	}
	if since := s.owned(key, now.Add(time.Second), 3); !since.Equal(now) {
		t.Errorf("owned since %s, want the first time", since)
	}
	recent = s.snapshot(key, now, time.Minute).recent
	if last := recent[len(recent)-1]; last.Replicas != 12 {
		t.Errorf("a new owner keeps %v, want the 12 it found", last)
	}
	s.disowned(key)
	if r := s.pools[key]; !r.ownedSince.IsZero() || r.recent != nil {
		t.Errorf("disowned still holds %v since %s", r.recent, r.ownedSince)
	}
}

func TestPoolStatsBounded(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	var s poolStats
	// Sustained, 50 claims a second: at the bound the oldest go, and the
	// window's claims keep counting.
	for i := range 600 * 50 {
		at := now.Add(time.Duration(i) * 20 * time.Millisecond)
		s.claimed("default/echo", types.UID(fmt.Sprint(i)), at, at)
	}
	end := now.Add(600 * time.Second)
	if n := len(s.pools["default/echo"].claims); n > maxPoolClaims {
		t.Errorf("%d claims kept, over the bound %d", n, maxPoolClaims)
	}
	if n := len(s.snapshot("default/echo", end, 30*time.Second).claims); n < 1400 {
		t.Errorf("%d claims in the last 30s at 50/s, want about 1500", n)
	}
}

func TestPoolPolicyOf(t *testing.T) {
	t.Parallel()
	d := func(ann map[string]string) *appsv1.Deployment {
		dep := poolDeploy("echo")
		dep.Annotations = ann
		return dep
	}
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want poolPolicy
		err  []string
	}{
		{"defaults", nil, poolPolicy{min: defaultPoolMin, max: defaultPoolMax, headroom: scaling.DefaultPoolHeadroom, window: scaling.DefaultPoolWindow}, nil},
		{"all set", map[string]string{annPoolMin: "3", annPoolMax: "30", annPoolHeadroom: "2", annPoolWindow: "10s"},
			poolPolicy{min: 3, max: 30, headroom: 2, window: 10 * time.Second}, nil},
		{"zero minimum", map[string]string{annPoolMin: "0"}, poolPolicy{min: 0, max: defaultPoolMax, headroom: 1, window: scaling.DefaultPoolWindow}, nil},
		{"every problem at once", map[string]string{annPoolMin: "-1", annPoolMax: "x", annPoolHeadroom: "5000", annPoolWindow: "1h"}, poolPolicy{},
			[]string{annPoolMin + ` "-1"`, annPoolMax + ` "x"`, annPoolHeadroom + ` "5000"`, annPoolWindow + ` "1h"`}},
		{"max below min", map[string]string{annPoolMin: "5", annPoolMax: "4"}, poolPolicy{}, []string{"pool-max 4 is below skipper.dev/pool-min 5"}},
		{"a window too short", map[string]string{annPoolWindow: "10ms"}, poolPolicy{}, []string{annPoolWindow}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := poolPolicyOf(d(tc.ann))
			if len(tc.err) == 0 {
				if err != nil || got != tc.want {
					t.Errorf("poolPolicyOf = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.err)
			}
			for _, w := range tc.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// scalePatches records the replicas the controller patched pool
// Deployments to (the Deployment itself, never its scale subresource,
// which the admission policy refuses).
type scalePatches struct {
	mu  sync.Mutex
	got []int32
	on  []string
}

func (s *scalePatches) react(action k8stesting.Action) (bool, runtime.Object, error) {
	pa := action.(k8stesting.PatchAction)
	if pa.GetSubresource() != "" {
		return true, nil, fmt.Errorf("patched subresource %q of Deployment %s", pa.GetSubresource(), pa.GetName())
	}
	var body struct {
		Spec struct {
			Replicas int32 `json:"replicas"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(pa.GetPatch(), &body); err != nil {
		return true, nil, err
	}
	s.mu.Lock()
	s.got = append(s.got, body.Spec.Replicas)
	s.on = append(s.on, pa.GetName())
	s.mu.Unlock()
	return true, nil, nil
}

func (s *scalePatches) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got, s.on = nil, nil
}

func (s *scalePatches) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.on...)
}

func (s *scalePatches) all() []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int32(nil), s.got...)
}

// poolController is a controller whose pool worker is stopped (waiting
// for what it was deciding), so only the test's own syncPool calls decide,
// and whose ring has synced (empty: it owns every pool).
func poolController(t *testing.T, e *testEnv) *controller {
	t.Helper()
	c := startController(t, e, nil)
	c.poolQueue.ShutDownWithDrain()
	c.syncRing()
	return c
}

func TestSyncPoolScales(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	var patches scalePatches
	e.core.PrependReactor("patch", "deployments", patches.react)
	auto := poolDeploy("echo")
	auto.Annotations = map[string]string{v1alpha1.AnnotationAutoscale: "true", annPoolMin: "2", annPoolMax: "8", annPoolWindow: "5s"}
	auto.Spec.Replicas = ptr(int32(2))
	manual := poolDeploy("manual") // not opted in: never scaled
	bad := poolDeploy("bad")
	bad.Annotations = map[string]string{v1alpha1.AnnotationAutoscale: "true", annPoolMax: "none"}
	e.add(auto, manual, bad, poolPod("p1", "echo"), poolPod("p2", "echo"), poolPod("m1", "manual"))
	c := poolController(t, e)

	// At its minimum with no claims: nothing written.
	if err := c.syncPool(t.Context(), "default/echo"); err != nil {
		t.Fatal(err)
	}
	if got := patches.all(); len(got) != 0 {
		t.Fatalf("patched %v with no claims", got)
	}
	// Five claims over a second: 5/s × the default ready time 1s + 1.
	now := time.Now()
	for i := range 5 {
		c.pools.claimed("default/echo", types.UID(fmt.Sprint("c", i)), now.Add(-time.Duration(i)*250*time.Millisecond), now)
		c.pools.claimed("default/manual", types.UID(fmt.Sprint("c", i)), now, now)
	}
	for _, k := range []string{"default/echo", "default/manual", "default/bad"} {
		if err := c.syncPool(t.Context(), k); err != nil {
			t.Fatal(err)
		}
	}
	if got, on := patches.all(), patches.names(); len(got) != 1 || got[0] != 6 || on[0] != "echo" {
		t.Fatalf("patched %v on %v, want 6 on the autoscaled pool only", got, on)
	}
	poll.Until(t, pollTimeout, pollInterval, "an Event says why", func(ctx context.Context) error {
		evs, err := e.core.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var scaled, invalid bool
		for _, ev := range evs.Items {
			scaled = scaled || ev.Reason == "PoolScaled" && ev.InvolvedObject.Name == "echo" && strings.Contains(ev.Message, "replicas 2 → 6")
			invalid = invalid || ev.Reason == "InvalidPoolAutoscale" && ev.InvolvedObject.Name == "bad"
		}
		if !scaled || !invalid {
			return fmt.Errorf("PoolScaled event %t, InvalidPoolAutoscale event %t", scaled, invalid)
		}
		return nil
	})
}

func TestSyncPoolHoldsForUnrecordedClaims(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	var patches scalePatches
	e.core.PrependReactor("patch", "deployments", patches.react)
	auto := poolDeploy("echo")
	auto.Annotations = map[string]string{v1alpha1.AnnotationAutoscale: "true", annPoolMin: "1"}
	auto.Spec.Replicas = ptr(int32(4))
	e.add(auto, poolPod("p1", "echo"), poolPod("p2", "echo"), poolPod("p3", "echo", notReady))
	c := poolController(t, e)
	forgetHeld := func() { // what a new owner found is tested in TestPoolStats...
		c.pools.mu.Lock()
		c.pools.pools["default/echo"].recent = nil
		c.pools.mu.Unlock()
	}
	// A new owner waits a window before it scales down.
	if err := c.syncPool(t.Context(), "default/echo"); err != nil {
		t.Fatal(err)
	}
	if got := patches.all(); len(got) != 0 {
		t.Fatalf("a new owner patched %v at once", got)
	}
	forgetHeld()
	// p1's instance accepted a claim whose record has not landed: the
	// ReplicaSet still counts p1, so 4 → at least ready (p1, p2, as the
	// informer shows them) + unrecorded (p1), within the replicas: 3.
	fn := e.fnFor("hello", "echo")
	cl := c.claims
	cl.mu.Lock()
	cl.assumed[fn.Key()] = []assumedPod{{pod: claimedCopy(e.pod("p1"), fn, claimInfo{At: time.Now()}), at: time.Now()}}
	cl.mu.Unlock()
	if err := c.syncPool(t.Context(), "default/echo"); err != nil {
		t.Fatal(err)
	}
	if got := patches.all(); len(got) != 1 || got[0] != 3 {
		t.Fatalf("patched %v, want [3]: no lower while a claim is unrecorded", got)
	}
	// Held, being recorded, or being assigned count the same.
	for _, mark := range []func(bool){
		func(on bool) {
			cl.held[e.pod("p2").UID] = time.Now().Add(time.Minute)
			cl.assumed = map[string][]assumedPod{}
			_ = on
		},
		func(on bool) { cl.recording[e.pod("p2").UID] = on; cl.held = map[types.UID]time.Time{} },
		func(on bool) { cl.reserved[e.pod("p2").UID] = on; cl.recording = map[types.UID]bool{} },
	} {
		cl.mu.Lock()
		mark(true)
		cl.mu.Unlock()
		if n := c.unrecordedIn("default", "echo", time.Now()); n != 1 {
			t.Errorf("unrecorded %d, want 1", n)
		}
	}
	cl.mu.Lock()
	cl.reserved = map[types.UID]bool{}
	cl.mu.Unlock()
	forgetHeld()
	patches.reset()
	// The fake keeps the Deployment at 4; this replica wrote 3 a moment
	// ago, and takes that over the cache.
	if err := c.syncPool(t.Context(), "default/echo"); err != nil {
		t.Fatal(err)
	}
	if got := patches.all(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("patched %v, want [1]: down to the minimum once recorded", got)
	}
}
