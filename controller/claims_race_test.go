package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/ring"
	"skipper.dev/skipper/internal/poll"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// TestConcurrentClaimReleaseOwnershipMove runs claims (cold, scale-up,
// oneshot), releases and ownership moving back and forth (another
// replica's endpoint coming and going, through the informer and the ring
// sync, as in a rollout) at once. Run it under -race: nothing races, no
// oneshot instance is handed out twice, no pod holds two functions, and
// once the claims settle no reservation is left without its flight.
func TestConcurrentClaimReleaseOwnershipMove(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	const selfAddr = "127.0.0.1:9090" // startController's advertise address
	gone := listen(t)
	otherAddr := gone.Addr().String()
	gone.Close() // forwards to the other replica are refused at once
	rg, err := ring.New([]string{selfAddr, otherAddr})
	if err != nil {
		t.Fatal(err)
	}
	// Functions the other replica owns while its endpoint is ready.
	movable := func(prefix string) string {
		for i := range 1000 {
			if n := fmt.Sprintf("%s-%d", prefix, i); rg.Owner("default/"+n) == otherAddr {
				return n
			}
		}
		t.Fatal("no function the ring gives to the other replica")
		return ""
	}
	once, shared := e.fnFor(movable("once"), "echo"), e.fnFor(movable("shared"), "echo")
	once.Spec.Oneshot = true
	shared.Spec.MaxInstances = 4
	e.add(ctlSlice("ctl-0", 9090, "127.0.0.1"), poolDeploy("echo"), once, shared)
	for i := range 40 {
		e.add(poolPod(fmt.Sprintf("p%02d", i), "echo"))
	}
	c := startController(t, e, func(c *Config) {
		c.ScaleInterval, c.StatusInterval = 5*time.Millisecond, 5*time.Millisecond
		c.ClaimTimeout, c.ForwardTimeout = 300*time.Millisecond, 200*time.Millisecond
	})
	srv := &server{c: c}
	cachedOnce, err := c.cache.function("default", once.Name)
	if err != nil {
		t.Fatal(err)
	}
	cachedShared, err := c.cache.function("default", shared.Name)
	if err != nil {
		t.Fatal(err)
	}
	router := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a", Incarnation: "i1"}
	other := sliceOf("ctl-1", gone)

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		handed   = map[string]bool{} // oneshot pod UIDs handed out
		releases = make(chan string, 64)
	)
	// Ownership moves to the other replica and back, over and over.
	wg.Go(func() {
		ctx := context.Background()
		slices := e.core.DiscoveryV1().EndpointSlices(systemNS)
		for range 15 {
			if _, err := slices.Create(ctx, other, metav1.CreateOptions{}); err != nil {
				t.Errorf("add the other replica: %v", err)
				return
			}
			time.Sleep(3 * time.Millisecond) // sleep: load (ownership flaps while the claims run)
			if err := slices.Delete(ctx, other.Name, metav1.DeleteOptions{}); err != nil {
				t.Errorf("remove the other replica: %v", err)
				return
			}
			time.Sleep(3 * time.Millisecond) // sleep: load
		}
	})
	// Oneshot claims, each instance handed to its caller alone.
	var claimers sync.WaitGroup
	for range 3 {
		claimers.Go(func() {
			for range 4 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				resp, _, err := c.getOneshot(ctx, cachedOnce, e.assignPort, router, nil)
				cancel()
				if err != nil {
					continue // the pool ran dry or the call gave up: allowed here
				}
				uid := resp.GetInstance().GetPodUid()
				mu.Lock()
				if handed[uid] {
					t.Errorf("oneshot instance %s handed out twice", resp.GetInstance().GetPod())
				}
				handed[uid] = true
				mu.Unlock()
				releases <- uid
			}
		})
	}
	// Shared claims: cold ones, the supervisor's, and scale-ups beside it.
	for range 2 {
		claimers.Go(func() {
			for range 5 {
				c.touch(shared.Key(), time.Now())
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, _, _ = c.ensureInstance(ctx, cachedShared, e.assignPort, "", nil, nil)
				cancel()
				c.scaleUp(cachedShared, e.assignPort, 3)
			}
		})
	}
	// Releases, forwarded to the owner or answered here, while it moves.
	for i := range 2 {
		wg.Go(func() {
			for uid := range releases {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, _ = srv.releaseInstance(ctx, &skipperv1.ReleaseInstanceRequest{
					Function:  &skipperv1.FunctionRef{Namespace: "default", Name: once.Name},
					Router:    router,
					PodUid:    uid,
					Forwarded: i == 0,
				})
				cancel()
			}
		})
	}
	claimers.Wait()
	close(releases)
	wg.Wait()
	if len(handed) == 0 {
		t.Error("no oneshot claim succeeded: the test exercised nothing")
	}
	if got := metricValue(t, c.metrics.ownershipMoves); got == 0 {
		t.Error("ownership never moved")
	} else {
		t.Logf("%d oneshot instances handed out, %v ownership moves", len(handed), got)
	}

	reservedLeft := 0
	poll.Until(t, pollTimeout, pollInterval, "the claims in flight to end", func(context.Context) error {
		c.claims.mu.Lock()
		defer c.claims.mu.Unlock()
		reservedLeft = len(c.claims.reserved)
		if n := c.claims.inFlightLocked(); n != 0 {
			return fmt.Errorf("%d in flight", n)
		}
		return nil
	})
	if reservedLeft != 0 {
		t.Errorf("%d pods reserved with no claim in flight", reservedLeft)
	}
	pods, err := e.core.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range pods.Items {
		name, ok := p.Labels[v1alpha1.LabelFunction]
		if !ok {
			continue
		}
		if held := e.holds[string(p.UID)]; held != "default/"+name {
			t.Errorf("pod %s recorded for %s, its instance holds %q", p.Name, name, held)
		}
		if n := functionOwners(&p); n != 1 {
			t.Errorf("pod %s has %d Function owners, want 1", p.Name, n)
		}
	}
}

// functionOwners counts the Function ownerReferences of p.
func functionOwners(p *corev1.Pod) int {
	n := 0
	for _, r := range p.OwnerReferences {
		if r.Kind == "Function" {
			n++
		}
	}
	return n
}

// TestClaimsConcurrent drives the claims type from many goroutines at once
// (joins and landings, reservations, retirements, records, views,
// forgetting): under -race nothing races, no pod is reserved twice at
// once, and every flight lands.
func TestClaimsConcurrent(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	key := fn.Key()
	var pool []*corev1.Pod
	for i := range 8 {
		pool = append(pool, testPod(fmt.Sprintf("p%d", i)))
	}
	cl := newClaims(func(uid string) bool { return uid < "uid-p4" }, nil)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		taken  = map[types.UID]bool{}
		double []types.UID
	)
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				switch (g + i) % 4 {
				case 0: // a claim: join, reserve, land
					f, leader, _ := cl.join(key, nil)
					if !leader {
						f = cl.start(key, flightScale)
					}
					p := cl.reserve(fn, pool, "node-1", nil, now)
					if p != nil {
						mu.Lock()
						if taken[p.UID] {
							double = append(double, p.UID)
						}
						taken[p.UID] = true
						mu.Unlock()
						if i%3 == 0 {
							mu.Lock()
							delete(taken, p.UID)
							mu.Unlock()
							cl.unreserve(p.UID)
							p = nil
						}
					}
					var claimed *corev1.Pod
					if p != nil {
						// The reservation ends with the landing; the pod is
						// assumed then, until forget.
						mu.Lock()
						delete(taken, p.UID)
						mu.Unlock()
						claimed = claimedCopy(p, fn, claimInfo{At: now})
						if cl.startRecording(p.UID) {
							cl.recordEnded(key, p.UID, recordState(i%4), now)
						}
					}
					cl.land(key, f, claimed, now)
				case 1: // a release or a drain
					cl.retire(pool[i%len(pool)].UID, now.Add(time.Second))
					cl.hold(pool[(i+1)%len(pool)].UID, now.Add(time.Second))
					_ = cl.retiredUIDs(now)
				case 2: // a supervisor's tick and a scale-up
					_ = cl.view(key, pool, now)
					for _, f := range cl.startScale(fn, nil, pool, 2, 4, now) {
						cl.land(key, f, nil, now)
					}
				case 3: // ownership moves, the pool autoscaler, the lag metric
					cl.forget(key)
					_ = cl.unrecordedIn("echo", pool, map[string][]*corev1.Pod{key: nil}, now)
					_ = cl.assumedKeys("default")
					_ = cl.lag(now)
				}
			}
		})
	}
	wg.Wait()
	if len(double) > 0 {
		t.Errorf("pods reserved twice: %v", double)
	}
	if n := cl.inFlight(); n != 0 {
		t.Errorf("%d flights left, want 0", n)
	}
}
