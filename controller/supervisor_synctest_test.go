package controller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// roundTripFunc answers HTTP requests in memory: instances' assign
// endpoints without sockets, so the supervisor loop runs on fake time.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// fakeTimeController starts a controller inside a synctest bubble on fake
// clients: a Function "hello" (pool echo, port 8080, at most 4 instances,
// target 1 in flight, idleTimeout 30s; modify, when set, changes it), 6
// ready pool pods, and instances whose assign endpoint answers in memory
// with the status answer returns (nil: 200), counted in assigned.
func fakeTimeController(t *testing.T, modify func(*v1alpha1.Function), answer func(*http.Request) int) (e *testEnv, c *controller, cfg Config, assigned *atomic.Int32) {
	e = &testEnv{t: t, failFn: map[string]int{}, holds: map[string]string{}, holdClaims: map[string]string{}}
	e.core = fake.NewClientset()
	e.core.PrependReactor("patch", "pods", e.patchPod)
	e.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.Resource: "FunctionList"})
	fn := testFunction("hello")
	fn.Spec.Pool, fn.Spec.Port, fn.Spec.MaxInstances = "echo", 8080, 4
	fn.Spec.Scaling.TargetInFlight = 1
	fn.Spec.IdleTimeout = &metav1.Duration{Duration: 30 * time.Second}
	if modify != nil {
		modify(fn)
	}
	e.add(poolDeploy("echo"), fn)
	for i := range 6 {
		e.add(poolPod(fmt.Sprintf("p%d", i), "echo"))
	}

	cfg = validConfig()
	cfg.PodName, cfg.PodNamespace = "ctl-0", systemNS
	cfg.ScaleInterval, cfg.HeartbeatTimeout, cfg.ReportInterval = time.Second, 3*time.Second, time.Second
	cfg.ScaleDownStabilization, cfg.StatusInterval = 10*time.Second, time.Second
	key := newTestAssignKey(t)
	c, err := newController(cfg, "127.0.0.1:9090", slog.New(slog.NewTextHandler(io.Discard, nil)), clients{core: e.core, dyn: e.dyn}, key, newMetrics())
	if err != nil {
		t.Fatal(err)
	}
	assigned = &atomic.Int32{}
	c.http = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Path != assign.Path {
			return nil, fmt.Errorf("unexpected request %s", r.URL)
		}
		assigned.Add(1)
		code := http.StatusOK
		if answer != nil {
			code = answer(r)
		}
		return &http.Response{StatusCode: code, Body: io.NopCloser(strings.NewReader("")), Header: http.Header{}}, nil
	})}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); c.stop() })
	c.start(ctx)
	if !c.cache.waitSynced(ctx) {
		t.Fatal("caches did not sync")
	}
	synctest.Wait()
	return e, c, cfg, assigned
}

// TestSupervisorTimingOnFakeTime checks the loop's clocks exactly: a scale-up
// one tick after the report that asks for it, no scale-down while the
// owner warms up or within the stabilization window, and scale to zero at
// idleTimeout after the last activity.
func TestSupervisorTimingOnFakeTime(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e, c, cfg, assigned := fakeTimeController(t, nil, nil)

		router := &skipperv1.RouterIdentity{Pod: "router-a", Incarnation: "i1"}
		seq := uint64(0)
		report := func(inFlight uint32) {
			seq++
			rep, v := checkReport(&skipperv1.Report{Sequence: seq, Time: timestamppb.Now(), Functions: []*skipperv1.FunctionReport{{
				Function: &skipperv1.FunctionRef{Namespace: "default", Name: "hello"}, InFlight: inFlight,
			}}}, time.Now())
			if len(v) > 0 || len(rep.Functions) != 1 {
				t.Fatalf("checkReport: %v, %d functions", v, len(rep.Functions))
			}
			c.observeReport(router, rep, rep.Functions[0], time.Now())
		}
		instances := func() int {
			return len(e.livePods("hello"))
		}
		// Reports every second, as a router sends them, for d.
		reportFor := func(d time.Duration, inFlight uint32) {
			for end := time.Now().Add(d); time.Now().Before(end); {
				report(inFlight)
				time.Sleep(time.Second) // sleep: behaviour (fake clock: a report a second)
				synctest.Wait()
			}
		}

		start := time.Now()
		report(3) // load on a function with nothing: the supervisor starts and claims
		// Within one tick of the report (fake time; polled in 10ms steps, as
		// the claims' goroutines may need more than one pass to settle).
		for n := 0; instances() != 3; n++ {
			if time.Since(start) > cfg.ScaleInterval {
				t.Fatalf("%d instances %s after a report of 3 in flight, want 3 within a tick (%s)",
					instances(), time.Since(start), cfg.ScaleInterval)
			}
			time.Sleep(10 * time.Millisecond) // sleep: poll (fake clock)
			synctest.Wait()
		}
		reportFor(5*time.Second, 3)

		// The load drops to one: scale-down waits for the 10s stabilization
		// window since the last recommendation of 3.
		drop := time.Now()
		for instances() == 3 {
			report(1)
			time.Sleep(time.Second) // sleep: behaviour (fake clock: a report a second)
			synctest.Wait()
			if time.Since(drop) > 30*time.Second {
				t.Fatal("no scale-down within 30s")
			}
		}
		if took := time.Since(drop); took < 10*time.Second || took > 13*time.Second {
			t.Errorf("scaled down %s after the load dropped, want the 10s window (+ a tick and a report interval to drain)", took)
		}
		if n := instances(); n != 1 {
			t.Errorf("%d instances after the scale-down, want 1", n)
		}

		// Idle: nothing in flight from now on → zero at idleTimeout.
		idle := time.Now()
		for instances() > 0 {
			report(0)
			time.Sleep(time.Second) // sleep: behaviour (fake clock: a report a second)
			synctest.Wait()
			if time.Since(idle) > time.Minute {
				t.Fatal("no scale to zero within a minute")
			}
		}
		if took := time.Since(idle); took < 30*time.Second || took > 33*time.Second {
			t.Errorf("scaled to zero %s after the last activity, want idleTimeout 30s (+ a tick and a report interval)", took)
		}
		if n := assigned.Load(); n != 3 {
			t.Errorf("%d assignments, want 3", n)
		}
		t.Logf("whole run: %s of fake time", time.Since(start))
	})
}

// TestColdGetInstanceWritesOnlyTheClaim checks the cold start's critical
// path on the API server: a GetInstance that starts a function from zero
// writes the claim patch and the record of its assignment and nothing else
// until it has answered; the
// supervisor it starts writes status and its ScaledUp Event one scale
// interval later, when they no longer compete with the claim.
func TestColdGetInstanceWritesOnlyTheClaim(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e, c, cfg, assigned := fakeTimeController(t, nil, nil)
		e.core.ClearActions()
		e.dyn.ClearActions()
		writes := func() (claims, others []string) {
			for _, a := range append(e.core.Actions(), e.dyn.Actions()...) {
				verb := a.GetVerb()
				if verb == "get" || verb == "list" || verb == "watch" {
					continue
				}
				what := verb + " " + a.GetResource().Resource + "/" + a.GetSubresource()
				if verb == "patch" && a.GetResource().Resource == "pods" {
					claims = append(claims, what)
				} else {
					others = append(others, what)
				}
			}
			return claims, others
		}
		start := time.Now()
		_, err := (&server{c: c}).GetInstance(context.Background(), &skipperv1.GetInstanceRequest{
			Function: &skipperv1.FunctionRef{Namespace: "default", Name: "hello"},
			Router:   &skipperv1.RouterIdentity{Pod: "router-a", Incarnation: "i1", Node: "node-a"},
		})
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // whatever the call set off and can run without the clock moving
		claims, others := writes()
		if len(claims) != 1 || assigned.Load() != 1 {
			t.Fatalf("cold GetInstance: %d pod patches and %d assignments, want 1 (the record, after the assign) and 1", len(claims), assigned.Load())
		}
		if len(others) > 0 {
			t.Errorf("cold GetInstance wrote %v before a scale interval passed; want only the claim's record", others)
		}
		// One interval later the supervisor's first tick records the scale-up.
		time.Sleep(cfg.ScaleInterval - time.Since(start)) // sleep: behaviour (fake clock: to the first tick)
		synctest.Wait()
		_, others = writes()
		if !slices.Contains(others, "patch functions/status") || !slices.Contains(others, "create events/") && !slices.Contains(others, "patch events/") {
			t.Errorf("after one scale interval the writes are %v, want the status patch and the ScaledUp Event", others)
		}
	})
}

// TestScaleUpBacksOffAfterFailedClaims: instances that refuse their
// assignment are deleted, and the supervisor retries with exponential
// back-off (one scale interval, then twice as long each time) rather than
// on every tick.
func TestScaleUpBacksOffAfterFailedClaims(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, _, cfg, assigned := fakeTimeController(t,
			func(fn *v1alpha1.Function) { fn.Spec.MinInstances = 1 },
			func(*http.Request) int { return http.StatusInternalServerError })
		// Each tick, note when a new attempt came (the pool's 6 pods last
		// 6 attempts: 31 intervals).
		start := time.Now()
		var at []time.Duration
		for seen := int32(0); time.Since(start) < 30*cfg.ScaleInterval; {
			if n := assigned.Load(); n != seen {
				at, seen = append(at, time.Since(start)), n
			}
			passTick(cfg)
		}
		var gaps []time.Duration
		for i := 1; i < len(at); i++ {
			gaps = append(gaps, at[i]-at[i-1])
		}
		want := []time.Duration{cfg.ScaleInterval, 2 * cfg.ScaleInterval, 4 * cfg.ScaleInterval, 8 * cfg.ScaleInterval}
		if diff := cmp.Diff(want, gaps); diff != "" {
			t.Errorf("attempts at %v: gaps (-want +got):\n%s", at, diff)
		}
	})
}

// hubRouter is a router on a fake-time controller's hub, without a
// stream: its reports go to takeReport as the server hands them over, the
// updates queued for it wait in its routerStream, and it acks what the
// test says.
type hubRouter struct {
	t      *testing.T
	c      *controller
	id     *skipperv1.RouterIdentity
	rs     *routerStream
	seq    uint64
	latest *skipperv1.AssignmentUpdate // the newest update of hello taken
}

func newHubRouter(t *testing.T, c *controller, pod string) *hubRouter {
	t.Helper()
	id := &skipperv1.RouterIdentity{Node: "node-1", Pod: pod, Incarnation: "i1"}
	rs, err := c.hub.register(id)
	if err != nil {
		t.Fatal(err)
	}
	return &hubRouter{t: t, c: c, id: id, rs: rs}
}

// send hands the controller a report, as the server does one it received,
// and returns its violations.
func (r *hubRouter) send(rep *skipperv1.Report) violations {
	r.seq++
	rep.Sequence, rep.Time = r.seq, timestamppb.Now()
	_, v := r.c.takeReport(r.rs, r.id, rep, time.Now())
	return v
}

// load reports inFlight requests in flight for hello.
func (r *hubRouter) load(inFlight uint32) {
	r.t.Helper()
	if v := r.send(&skipperv1.Report{Functions: []*skipperv1.FunctionReport{{Function: ref("default", "hello"), InFlight: inFlight}}}); len(v) > 0 {
		r.t.Fatalf("report of %d in flight: violations %v", inFlight, v)
	}
}

// update takes the updates queued for the router and returns the newest
// of hello so far (nil: none yet).
func (r *hubRouter) update() *skipperv1.AssignmentUpdate {
	for _, u := range r.rs.take() {
		if u.GetFunction().GetName() == "hello" && u.GetGeneration() >= r.latest.GetGeneration() {
			r.latest = u
		}
	}
	return r.latest
}

// passTick lets one scale interval of fake time pass and everything it sets
// off run.
func passTick(cfg Config) {
	time.Sleep(cfg.ScaleInterval) // sleep: behaviour (fake clock: a tick)
	synctest.Wait()
}

// TestDrainWaitsForTheRoutersAck: instances withdrawn by a scale-down stay
// while a subscribed router has not acknowledged the update without them,
// tick after tick, and go once it has.
func TestDrainWaitsForTheRoutersAck(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e, c, cfg, _ := fakeTimeController(t, nil, nil)
		r := newHubRouter(t, c, "skipper-system/router-a")
		live := func() int { return len(e.livePods("hello")) }
		for start := time.Now(); live() != 3 || len(r.update().GetInstances()) != 3; passTick(cfg) {
			if time.Since(start) > 5*cfg.ScaleInterval {
				t.Fatalf("%d instances, update %v, after 5 intervals of 3 in flight; want 3", live(), r.latest)
			}
			r.load(3)
		}
		r.rs.ack("default/hello", r.latest.GetGeneration())

		// The load drops to one: after the stabilization window two
		// instances are withdrawn.
		for start := time.Now(); len(r.update().GetInstances()) != 1; passTick(cfg) {
			if time.Since(start) > 2*cfg.ScaleDownStabilization {
				t.Fatalf("no withdrawal to one instance within %s of the load dropping: update %v", 2*cfg.ScaleDownStabilization, r.latest)
			}
			r.load(1)
		}
		withdrawal := r.latest.GetGeneration()
		for range 10 {
			if n := live(); n != 3 {
				t.Fatalf("%d instances before the router acked the withdrawal, want 3", n)
			}
			r.load(1)
			passTick(cfg)
		}
		r.rs.ack("default/hello", withdrawal)
		for start := time.Now(); live() != 1; passTick(cfg) {
			if time.Since(start) > 2*cfg.ScaleInterval {
				t.Fatalf("%d instances two intervals after the ack, want 1", live())
			}
			r.load(1)
		}
	})
}

// TestPodReachesRoutersOnlyAfterItsAssign: while a claimed pod's instance
// has not accepted its assignment, the pod is in no instance set and no
// router is handed it, however long the assign takes; once it accepts,
// the subscribed router gets it and the record follows. (The same over a
// real Connect stream: TestPodReachesRoutersOnlyAfterAssign.)
func TestPodReachesRoutersOnlyAfterItsAssign(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		accept := make(chan struct{})
		e, c, cfg, assigned := fakeTimeController(t, nil, func(*http.Request) int {
			<-accept
			return http.StatusOK
		})
		r := newHubRouter(t, c, "skipper-system/router-a")
		r.rs.subscribe("default/hello")
		s := &server{c: c}
		got := make(chan *skipperv1.GetInstanceResponse, 1)
		go func() {
			resp, err := s.GetInstance(context.Background(), &skipperv1.GetInstanceRequest{Function: ref("default", "hello"), Router: r.id})
			if err != nil {
				t.Errorf("GetInstance: %v", err)
			}
			got <- resp
		}()
		synctest.Wait()
		if n := assigned.Load(); n != 1 {
			t.Fatalf("%d assign requests, want the one that waits", n)
		}
		// Three ticks with the assign pending (within --assign-timeout).
		for range 3 {
			passTick(cfg)
			if u := r.update(); len(u.GetInstances()) != 0 {
				t.Fatalf("the router was handed %v before the instance accepted", u.GetInstances())
			}
			st, err := s.GetState(t.Context(), &skipperv1.GetStateRequest{Function: ref("default", "hello")})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range st.GetFunctions() {
				if len(f.GetInstances()) != 0 {
					t.Fatalf("GetState shows instances %v before the instance accepted", f.GetInstances())
				}
			}
			if claimed := e.claimedPods(); len(claimed) != 0 {
				t.Fatalf("%v recorded before the instance accepted", claimed)
			}
		}

		close(accept)
		synctest.Wait()
		resp := <-got
		if len(resp.GetInstances()) != 1 {
			t.Fatalf("GetInstance = %v, want one instance", resp)
		}
		pod := resp.GetInstances()[0].GetPod()
		if u := r.update(); len(u.GetInstances()) != 1 || u.GetInstances()[0].GetPod() != pod {
			t.Errorf("the router's update %v, want %s", u, pod)
		}
		if claimed := e.claimedPods(); !slices.Equal(claimed, []string{pod}) {
			t.Errorf("recorded %v, want %s", claimed, pod)
		}
	})
}

// TestReportOutOfBoundsChangesNothing: a report whose counts are far out
// of bounds is refused field by field (violations), and in ten scale
// intervals after it nothing is claimed or decided. (Its wire path and
// metrics: TestHugeReportChangesNoScaleDecision.)
func TestReportOutOfBoundsChangesNothing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e, c, cfg, assigned := fakeTimeController(t, nil, nil)
		r := newHubRouter(t, c, "skipper-system/router-a")
		v := r.send(&skipperv1.Report{Functions: []*skipperv1.FunctionReport{{
			Function: ref("default", "hello"), InFlight: math.MaxUint32, Queued: math.MaxUint32, RequestsTotal: math.MaxUint64,
			Instances: []*skipperv1.InstanceReport{{PodUid: "uid-p1", InFlight: math.MaxUint32, CpuMillicores: proto.Uint64(math.MaxUint64)}},
		}}})
		if len(v) == 0 {
			t.Fatal("no violations in a report out of bounds")
		}
		for range 10 {
			passTick(cfg)
		}
		if n, claimed := assigned.Load(), e.claimedPods(); n != 0 || len(claimed) != 0 {
			t.Errorf("a report out of bounds led to %d assigns, claimed %v", n, claimed)
		}
		st, err := (&server{c: c}).GetState(t.Context(), &skipperv1.GetStateRequest{Function: ref("default", "hello")})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range st.GetFunctions() {
			if f.GetDesired() != 0 {
				t.Errorf("desired %d after a report out of bounds, want 0", f.GetDesired())
			}
		}
	})
}
