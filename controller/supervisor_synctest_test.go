package controller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

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

// TestSupervisorTimingOnFakeTime checks the loop's clocks exactly: a scale-up
// one tick after the report that asks for it, no scale-down while the
// owner warms up or within the stabilization window, and scale to zero at
// idleTimeout after the last activity.
// fakeTimeController starts a controller inside a synctest bubble on fake
// clients: a Function "hello" (pool echo, port 8080, at most 4 instances,
// target 1 in flight, idleTimeout 30s), 6 ready pool pods, and instances
// whose assign endpoint answers 200 in memory, counted in assigned.
func fakeTimeController(t *testing.T) (e *testEnv, c *controller, cfg Config, assigned *atomic.Int32) {
	e = &testEnv{t: t, failFn: map[string]int{}, holds: map[string]string{}, holdClaims: map[string]string{}}
	e.core = fake.NewClientset()
	e.core.PrependReactor("patch", "pods", e.patchPod)
	e.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.Resource: "FunctionList"})
	fn := testFunction("hello")
	fn.Spec.Pool, fn.Spec.Port, fn.Spec.MaxInstances = "echo", 8080, 4
	fn.Spec.Scaling.TargetInFlight = 1
	fn.Spec.IdleTimeout = &metav1.Duration{Duration: 30 * time.Second}
	e.add(poolDeploy("echo"), fn)
	for i := range 6 {
		e.add(poolPod(fmt.Sprintf("p%d", i), "echo"))
	}

	cfg = validConfig()
	cfg.PodName, cfg.PodNamespace = "ctl-0", systemNS
	cfg.ScaleInterval, cfg.HeartbeatTimeout, cfg.ReportInterval = time.Second, 3*time.Second, time.Second
	cfg.ScaleDownStabilization, cfg.StatusInterval = 10*time.Second, time.Second
	key := newTestAssignKey(t)
	c, err := newController(cfg, "127.0.0.1:9090", slog.New(slog.NewTextHandler(io.Discard, nil)), e.core, e.dyn, key, newMetrics())
	if err != nil {
		t.Fatal(err)
	}
	assigned = &atomic.Int32{}
	c.http = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Path != assign.Path {
			return nil, fmt.Errorf("unexpected request %s", r.URL)
		}
		assigned.Add(1)
		return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("")), Header: http.Header{}}, nil
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

func TestSupervisorTimingOnFakeTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, c, cfg, assigned := fakeTimeController(t)

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
				time.Sleep(time.Second)
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
			time.Sleep(10 * time.Millisecond)
			synctest.Wait()
		}
		reportFor(5*time.Second, 3)

		// The load drops to one: scale-down waits for the 10s stabilization
		// window since the last recommendation of 3.
		drop := time.Now()
		for instances() == 3 {
			report(1)
			time.Sleep(time.Second)
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
			time.Sleep(time.Second)
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
	synctest.Test(t, func(t *testing.T) {
		e, c, cfg, assigned := fakeTimeController(t)
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
		time.Sleep(cfg.ScaleInterval - time.Since(start))
		synctest.Wait()
		_, others = writes()
		if !slices.Contains(others, "patch functions/status") || !slices.Contains(others, "create events/") && !slices.Contains(others, "patch events/") {
			t.Errorf("after one scale interval the writes are %v, want the status patch and the ScaledUp Event", others)
		}
	})
}
