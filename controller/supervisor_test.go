package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// startController runs a controller without its servers; it stops at the
// test's end.
func startController(t *testing.T, e *testEnv, modify func(*Config)) *controller {
	t.Helper()
	cfg := validConfig()
	cfg.PodName, cfg.PodNamespace, cfg.PodIP = "ctl-0", systemNS, "127.0.0.1"
	cfg.ClaimTimeout, cfg.AssignTimeout = 2*time.Second, 2*time.Second
	if modify != nil {
		modify(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	key := newTestAssignKey(t)
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := newController(cfg, "127.0.0.1:9090", log, clients{core: e.core, dyn: e.dyn}, key, newMetrics())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.start(ctx)
	t.Cleanup(func() {
		cancel()
		c.stop()
	})
	if !c.cache.waitSynced(t.Context()) {
		t.Fatal("caches did not sync")
	}
	return c
}

// staleInformer makes every pod watch silent: the pod informer keeps its
// initial list forever, the worst lag there is.
func staleInformer(e *testEnv) {
	e.core.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, watch.NewFake(), nil
	})
}

// claimedPods returns the pods the API server patched, each once (a claim
// is a claim patch and the record of its assignment).
func (e *testEnv) claimedPods() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Compact(slices.Sorted(slices.Values(e.patchedOK)))
}

func TestConcurrentScaleUpsWithStaleInformerNeverOverClaim(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	staleInformer(e)
	fn := e.fnFor("hello", "echo")
	fn.Spec.MaxInstances = 20
	e.add(poolDeploy("echo"), fn)
	for i := range 12 {
		e.add(poolPod(fmt.Sprintf("p%02d", i), "echo"))
	}
	c := startController(t, e, func(c *Config) { c.MaxParallelClaims = 2 })
	cached, err := c.cache.function("default", "hello")
	if err != nil {
		t.Fatal(err)
	}

	claimed := func() int {
		c.claims.mu.Lock()
		defer c.claims.mu.Unlock()
		n := 0
		for _, as := range c.claims.assumed {
			n += len(as)
		}
		return n
	}
	most := 0
	for _, want := range []int{3, 3, 5, 2} { // later rounds find the earlier claims only as expectations
		most = max(most, want)
		// Rounds of concurrent scale-ups, as ticks: each starts at most
		// --max-parallel-claims less those in flight, so a want above it
		// takes more than one round.
		for round := 0; ; round++ {
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() { c.scaleUp(cached, e.assignPort, want) })
			}
			// A cold GetInstance in the middle of it joins a claim in flight or
			// finds the set non-empty: it never claims on its own.
			if _, _, err := c.ensureInstance(t.Context(), cached, e.assignPort, "", nil, nil); err != nil {
				t.Fatalf("ensureInstance: %v", err)
			}
			wg.Wait()
			poll.Until(t, pollTimeout, pollInterval, "claims in flight to end", func(context.Context) error {
				if n := c.claims.inFlight(); n != 0 {
					return fmt.Errorf("%d in flight", n)
				}
				return nil
			})
			if claimed() >= most || round > 10 {
				break
			}
		}
		// The records follow the assigns in the background.
		poll.Until(t, pollTimeout, pollInterval, "the claims recorded", func(context.Context) error {
			if n := len(e.claimedPods()); n < most {
				return fmt.Errorf("%d claimed", n)
			}
			return nil
		})
		if got := e.claimedPods(); len(got) != most {
			t.Fatalf("after scale-ups to %d: claimed %d pods %v, want %d", want, len(got), got, most)
		}
	}
	if got := claimed(); got != 5 {
		t.Errorf("claimed %d pods, want 5 (the highest want)", got)
	}
	if n := len(e.assignRequests()); n != 5 {
		t.Errorf("%d assign requests, want 5", n)
	}
	// The informer never showed any claim, yet the set holds all of them.
	if set := c.currentSet(cached, e.assignPort, nil); len(set) != 5 {
		t.Errorf("instance set holds %d, want 5", len(set))
	}
	// A stalled informer shows as a growing lag.
	poll.Until(t, pollTimeout, pollInterval, "informer lag above zero", func(context.Context) error {
		var m dto.Metric
		if err := c.metrics.informerLag.Write(&m); err != nil {
			return err
		}
		if v := m.GetGauge().GetValue(); v <= 0 {
			return fmt.Errorf("lag %v", v)
		}
		return nil
	})
}

// fakeRouter is a router's Connect stream driven by a test.
type fakeRouter struct {
	t      *testing.T
	id     *skipperv1.RouterIdentity
	stream skipperv1.Controller_ConnectClient
	seq    uint64

	mu      sync.Mutex
	updates []*skipperv1.AssignmentUpdate
}

// connectRouter connects router pod on node-1 to r: see connectRouterAs.
func connectRouter(t *testing.T, r *replica, pod string) *fakeRouter {
	t.Helper()
	return connectRouterAs(t, r, &skipperv1.RouterIdentity{
		Node: "node-1", Pod: pod, Incarnation: "i1", ProtocolVersion: skipperv1.ProtocolVersion_PROTOCOL_VERSION_1,
	})
}

// connectRouterAs connects a router with identity id to r and returns it
// past the Welcome, recording the updates it is sent until the test ends.
func connectRouterAs(t *testing.T, r *replica, id *skipperv1.RouterIdentity) *fakeRouter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, _ := helloStream(t, ctx, r, id)
	fr := &fakeRouter{t: t, id: id, stream: stream}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if u := m.GetUpdate(); u != nil {
				fr.mu.Lock()
				fr.updates = append(fr.updates, u)
				fr.mu.Unlock()
			}
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return fr
}

// latest returns the newest update received, or nil.
func (fr *fakeRouter) latest() *skipperv1.AssignmentUpdate {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	var out *skipperv1.AssignmentUpdate
	for _, u := range fr.updates {
		if out == nil || u.GetGeneration() > out.GetGeneration() {
			out = u
		}
	}
	return out
}

// latestHolds says whether the latest update holds n instances, as a
// poll.Until condition.
func (fr *fakeRouter) latestHolds(n int) error {
	u := fr.latest()
	if u == nil {
		return errors.New("no update yet")
	}
	if got := len(u.GetInstances()); got != n {
		return fmt.Errorf("the latest update holds %d instances", got)
	}
	return nil
}

func (fr *fakeRouter) ack(name string, gen uint64) {
	fr.t.Helper()
	if err := fr.stream.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Ack{Ack: &skipperv1.Ack{
		Function: &skipperv1.FunctionRef{Namespace: "default", Name: name}, Generation: gen,
	}}}); err != nil {
		fr.t.Fatal(err)
	}
}

// report sends one heartbeat: the function's in-flight total, and
// per-instance in-flight by pod UID.
func (fr *fakeRouter) report(name string, inFlight uint32, perPod map[string]uint32) {
	fr.t.Helper()
	fr.seq++
	rep := &skipperv1.FunctionReport{Function: &skipperv1.FunctionRef{Namespace: "default", Name: name}, InFlight: inFlight}
	for uid, n := range perPod {
		rep.Instances = append(rep.Instances, &skipperv1.InstanceReport{PodUid: uid, InFlight: n})
	}
	if err := fr.stream.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Report{Report: &skipperv1.Report{
		Sequence: fr.seq, Time: timestamppb.Now(), Functions: []*skipperv1.FunctionReport{rep},
	}}}); err != nil {
		fr.t.Fatal(err)
	}
}

func (e *testEnv) livePods(fnName string) []*corev1.Pod {
	e.t.Helper()
	l, err := e.core.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*corev1.Pod
	for i := range l.Items {
		if l.Items[i].Labels[v1alpha1.LabelFunction] == fnName {
			out = append(out, &l.Items[i])
		}
	}
	return out
}

func (e *testEnv) functionStatus(name string) map[string]any {
	e.t.Helper()
	u, err := e.dyn.Resource(v1alpha1.Resource).Namespace("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	st, _, _ := unstructured.NestedMap(u.Object, "status")
	return st
}

// TestSupervisorScalesUpDrainsAndScalesToZero drives one function through
// a burst of load and its end: scale-up from reports, scale-down after the
// stabilization window with a drain that waits for the router's ack and
// in-flight, then scale to zero after idleTimeout.
func TestSupervisorScalesUpDrainsAndScalesToZero(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("hello", "echo")
	fn.Spec.MaxInstances = 3
	fn.Spec.Scaling.TargetInFlight = 1
	fn.Spec.IdleTimeout = &metav1.Duration{Duration: 1500 * time.Millisecond}
	e.add(poolDeploy("echo"), fn)
	for i := range 5 {
		e.add(poolPod(fmt.Sprintf("p%d", i), "echo"))
	}
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) {
		c.ScaleInterval, c.ReportInterval, c.HeartbeatTimeout = 20*time.Millisecond, 50*time.Millisecond, 400*time.Millisecond
		c.ScaleDownStabilization, c.DrainTimeout, c.StatusInterval = 300*time.Millisecond, 10*time.Second, 10*time.Millisecond
	})
	router := connectRouter(t, r, "skipper-system/router-a")

	resp, err := getInstance(t.Context(), r, "hello", router.id)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetInstances()) != 1 {
		t.Fatalf("cold GetInstance: %d instances, want 1", len(resp.GetInstances()))
	}
	// Load: 3 in flight with a target of 1 → 3 instances.
	poll.Until(t, pollTimeout, 20*time.Millisecond, "scale-up to 3 instances pushed to the router", func(context.Context) error {
		router.report("hello", 3, nil)
		return router.latestHolds(3)
	})
	// The fake API server records a claim just after the informer may show
	// it: wait for the third, then check no fourth follows.
	poll.Until(t, pollTimeout, pollInterval, "three claims recorded", func(context.Context) error {
		if n := len(e.claimedPods()); n < 3 {
			return fmt.Errorf("%d claimed", n)
		}
		return nil
	})
	state, err := r.client.GetState(t.Context(), &skipperv1.GetStateRequest{Function: &skipperv1.FunctionRef{Namespace: "default", Name: "hello"}})
	if err != nil || len(state.GetFunctions()) != 1 {
		t.Fatalf("GetState = %v, %v", state, err)
	}
	if f := state.GetFunctions()[0]; f.GetDesired() != 3 || f.GetLastScaleReason() != "inFlight" {
		t.Errorf("GetState function = %v, want desired 3 for inFlight", f)
	}
	up := router.latest()
	router.ack("hello", up.GetGeneration())

	// Load ends, but one instance still has a request in flight: after the
	// stabilization window the set shrinks to one (the function is still
	// active), and the drained pods wait for the ack and in-flight.
	busy := up.GetInstances()[0].GetPodUid()
	poll.Until(t, pollTimeout, 20*time.Millisecond, "scale-down withdrawal pushed", func(context.Context) error {
		router.report("hello", 1, map[string]uint32{busy: 1})
		return router.latestHolds(1)
	})
	down := router.latest()
	kept := down.GetInstances()[0].GetPodUid()
	if kept != busy {
		t.Errorf("kept instance %s, want the busy one %s (the least loaded drain first)", kept, busy)
	}
	// Nothing is deleted before the ack (tick after tick, on fake time:
	// TestDrainWaitsForTheRoutersAck).
	if n := len(e.livePods("hello")); n != 3 {
		t.Fatalf("%d instances before the router acked the withdrawal, want 3", n)
	}
	if n := len(e.claimedPods()); n != 3 {
		t.Errorf("%d claims, want 3", n)
	}
	router.ack("hello", down.GetGeneration())
	poll.Until(t, pollTimeout, 20*time.Millisecond, "drained pods deleted", func(context.Context) error {
		router.report("hello", 1, map[string]uint32{busy: 1})
		if n := len(e.livePods("hello")); n != 1 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
	if got := e.livePods("hello")[0].UID; string(got) != kept {
		t.Errorf("the remaining instance is %s, want %s", got, kept)
	}

	// Idle: no load for idleTimeout → scale to zero, the last pod drained.
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "scale to zero", func(context.Context) error {
		router.report("hello", 0, nil)
		if u := router.latest(); u != nil && len(u.GetInstances()) == 0 {
			router.ack("hello", u.GetGeneration())
		}
		if n := len(e.livePods("hello")); n != 0 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
	poll.Until(t, pollTimeout, 20*time.Millisecond, "status desired 0 reason idle", func(context.Context) error {
		st := e.functionStatus("hello")
		if fmt.Sprint(st["desired"]) != "0" || st["lastScaleReason"] != "idle" || st["owner"] != "ctl-0" {
			return fmt.Errorf("status %v", st)
		}
		return nil
	})
	_, metrics := httpGetBody(t, r.httpAddr, "/metrics")
	for _, want := range []string{
		`skipper_controller_scale_decisions_total{direction="up",function="default/hello",reason="inFlight"} 1`,
		`skipper_controller_scale_decisions_total{direction="down",function="default/hello",reason="idle"} 1`,
		`skipper_controller_scale_decisions_total{direction="down",function="default/hello",reason="cpu"} 0`,
		`skipper_controller_ownership_moves_total 0`,
		`skipper_controller_informer_lag_seconds `,
		`skipper_controller_pool_waiters{pool="default/echo"} 0`,
		`skipper_controller_instances{function="default/hello",state="draining"} 0`,
	} {
		if !containsLine(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	evs, err := e.core.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]bool{}
	for _, ev := range evs.Items {
		reasons[ev.Reason] = true
	}
	if !reasons["ScaledUp"] || !reasons["ScaledDown"] {
		t.Errorf("events %v, want ScaledUp and ScaledDown", reasons)
	}
}

func containsLine(body, prefix string) bool {
	for line := range splitLines(body) {
		if len(line) >= len(prefix) && line[:len(prefix)] == prefix {
			return true
		}
	}
	return false
}

func splitLines(s string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for len(s) > 0 {
			i := 0
			for i < len(s) && s[i] != '\n' {
				i++
			}
			if !yield(s[:i]) {
				return
			}
			if i == len(s) {
				return
			}
			s = s[i+1:]
		}
	}
}

func TestSupervisorKeepsMinInstancesAndRetiresRestarted(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("hello", "echo")
	fn.Spec.MinInstances, fn.Spec.MaxInstances = 2, 4
	e.add(poolDeploy("echo"), fn)
	for i := range 5 {
		e.add(poolPod(fmt.Sprintf("p%d", i), "echo"))
	}
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) {
		c.ScaleInterval, c.StatusInterval = 20*time.Millisecond, 10*time.Millisecond
	})
	// No call, no report: minInstances alone starts the supervisor.
	poll.Until(t, pollTimeout, pollInterval, "two instances claimed", func(context.Context) error {
		if n := len(e.livePods("hello")); n != 2 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
	poll.Until(t, pollTimeout, pollInterval, "status desired 2 ready 2, conditions", func(context.Context) error {
		st := e.functionStatus("hello")
		conds, _ := st["conditions"].([]any)
		if fmt.Sprint(st["desired"]) != "2" || fmt.Sprint(st["ready"]) != "2" || st["lastScaleReason"] != "minInstances" || len(conds) != 3 {
			return fmt.Errorf("status %v", st)
		}
		return nil
	})

	// A container restart loses the assignment: the pod is deleted and
	// replaced by a fresh claim.
	victim := e.livePods("hello")[0]
	victim.Status.ContainerStatuses[0].RestartCount++
	if _, err := e.core.CoreV1().Pods("default").UpdateStatus(t.Context(), victim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, pollInterval, "restarted instance deleted and replaced", func(ctx context.Context) error {
		if err := podGone(ctx, e, victim.Name); err != nil {
			return err
		}
		if n := len(e.livePods("hello")); n != 2 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
	resp, err := getInstance(t.Context(), r, "hello", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range resp.GetInstances() {
		if in.GetPod() == victim.Name {
			t.Errorf("restarted pod %s still handed out", victim.Name)
		}
	}
}

func TestPoolExhaustedSetsConditionAndEvent(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("hello", "empty")
	fn.Spec.MinInstances = 1
	e.add(poolDeploy("empty"), fn)
	startReplica(t, e, "ctl-0", nil, func(c *Config) {
		c.ScaleInterval, c.StatusInterval, c.ClaimTimeout = 20*time.Millisecond, 10*time.Millisecond, 100*time.Millisecond
	})
	poll.Until(t, pollTimeout, pollInterval, "PoolAvailable False with the reason", func(context.Context) error {
		conds, _ := e.functionStatus("hello")["conditions"].([]any)
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == conditionPoolAvailable && m["status"] == "False" && m["reason"] == "PoolExhausted" {
				return nil
			}
		}
		return fmt.Errorf("conditions %v", conds)
	})
	poll.Until(t, pollTimeout, pollInterval, "PoolExhausted event", func(ctx context.Context) error {
		evs, err := e.core.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Reason == "PoolExhausted" && ev.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("none among %d events", len(evs.Items))
	})
}

func TestOneshotInstancePerCallReleasedByItsRouter(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("once", "echo")
	fn.Spec.Oneshot = true
	e.add(poolDeploy("echo"), fn, e.fnFor("shared", "echo"))
	for i := range 4 {
		e.add(poolPod(fmt.Sprintf("p%d", i), "echo"))
	}
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) { c.ScaleInterval, c.OneshotLease = 20*time.Millisecond, 2*time.Second })
	routerA := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a", Incarnation: "i1"}
	routerB := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-b", Incarnation: "i1"}

	first, err := getInstance(t.Context(), r, "once", routerA)
	if err != nil {
		t.Fatal(err)
	}
	second, err := getInstance(t.Context(), r, "once", routerA)
	if err != nil {
		t.Fatal(err)
	}
	for _, resp := range []*skipperv1.GetInstanceResponse{first, second} {
		if resp.GetInstance().GetPodUid() == "" || len(resp.GetInstances()) != 0 || !resp.GetConfig().GetOneshot() {
			t.Fatalf("oneshot response = %v, want one instance in .instance, none shared, config.oneshot", resp)
		}
	}
	if first.GetInstance().GetPodUid() == second.GetInstance().GetPodUid() {
		t.Fatalf("two calls got the same instance %s", first.GetInstance().GetPod())
	}
	poll.Until(t, pollTimeout, pollInterval, "the oneshot's router recorded on its pod", func(context.Context) error {
		if got := e.pod(first.GetInstance().GetPod()).Annotations[annOneshotRouter]; got != routerA.GetPod() {
			return fmt.Errorf("router %q", got)
		}
		return nil
	})

	release := func(name string, router *skipperv1.RouterIdentity, uid string) error {
		_, err := r.client.ReleaseInstance(t.Context(), &skipperv1.ReleaseInstanceRequest{
			Function: &skipperv1.FunctionRef{Namespace: "default", Name: name}, Router: router, PodUid: uid,
		})
		return err
	}
	for _, tt := range []struct {
		name, fn, uid string
		router        *skipperv1.RouterIdentity
		want          codes.Code
	}{
		{name: "another router", fn: "once", uid: first.GetInstance().GetPodUid(), router: routerB, want: codes.PermissionDenied},
		{name: "unknown pod", fn: "once", uid: "nope", router: routerA, want: codes.NotFound},
		{name: "shared function", fn: "shared", uid: first.GetInstance().GetPodUid(), router: routerA, want: codes.FailedPrecondition},
		{name: "no router", fn: "once", uid: first.GetInstance().GetPodUid(), want: codes.InvalidArgument},
	} {
		if err := release(tt.fn, tt.router, tt.uid); status.Code(err) != tt.want {
			t.Errorf("%s: ReleaseInstance = %v, want %v", tt.name, err, tt.want)
		}
	}
	if _, err := e.core.CoreV1().Pods("default").Get(t.Context(), first.GetInstance().GetPod(), metav1.GetOptions{}); err != nil {
		t.Fatalf("refused releases deleted the pod: %v", err)
	}
	if err := release("once", routerA, first.GetInstance().GetPodUid()); err != nil {
		t.Fatalf("ReleaseInstance by its router: %v", err)
	}
	if _, err := e.core.CoreV1().Pods("default").Get(t.Context(), first.GetInstance().GetPod(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("released pod: err = %v, want NotFound", err)
	}
	// The instance its router never released goes at the lease's end.
	poll.Until(t, pollTimeout, 20*time.Millisecond, "unreleased oneshot instance deleted after --oneshot-lease", func(ctx context.Context) error {
		return podGone(ctx, e, second.GetInstance().GetPod())
	})
	// The shared set of a oneshot function stays empty.
	st, err := r.client.GetState(t.Context(), &skipperv1.GetStateRequest{Function: &skipperv1.FunctionRef{Namespace: "default", Name: "once"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range st.GetFunctions() {
		if len(f.GetInstances()) != 0 {
			t.Errorf("oneshot function's shared set = %v, want empty", f.GetInstances())
		}
	}
}

// TestOwnershipMoveHandsSupervisionOver: when a function moves to another
// replica, the old owner's supervisor stops, the new one takes the
// instances over (status, Event, metric) and scales down only after one
// full heartbeat window.
func TestOwnershipMoveHandsSupervisionOver(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	la, lb := listen(t), listen(t)
	name := functionOwnedBy(t, lb, la, lb)
	fn := e.fnFor(name, "echo")
	fn.Spec.Scaling.TargetInFlight = 1
	fn.Spec.IdleTimeout = &metav1.Duration{Duration: time.Hour}
	e.add(sliceOf("ctl-a", la), poolDeploy("echo"), fn)
	for i := range 4 {
		e.add(poolPod(fmt.Sprintf("p%d", i), "echo"))
	}
	const heartbeat = time.Second
	cfg := func(c *Config) {
		c.ScaleInterval, c.StatusInterval, c.ReportInterval, c.HeartbeatTimeout = 20*time.Millisecond, 10*time.Millisecond, 100*time.Millisecond, heartbeat
		c.ScaleDownStabilization = time.Minute // A holds its instances until the move
	}
	a := startReplica(t, e, "ctl-a", la, cfg)
	b := startReplica(t, e, "ctl-b", lb, cfg)
	router := connectRouter(t, a, "skipper-system/router-m")
	if _, err := getInstance(t.Context(), a, name, router.id); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, pollInterval, "A scales to two instances", func(context.Context) error {
		router.report(name, 2, nil)
		if n := len(e.livePods(name)); n != 2 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})

	// B joins and owns the function: A stops, B takes over.
	e.add(sliceOf("ctl-b", lb))
	var takeover time.Time
	poll.Until(t, pollTimeout, pollInterval, "status.owner ctl-b", func(context.Context) error {
		takeover = time.Now()
		if owner := e.functionStatus(name)["owner"]; owner != "ctl-b" {
			return fmt.Errorf("owner %v", owner)
		}
		return nil
	})
	for time.Since(takeover) < heartbeat*7/10 {
		if n := len(e.livePods(name)); n != 2 {
			t.Fatalf("%d instances %s after the move, want 2 until a heartbeat window passed", n, time.Since(takeover))
		}
		time.Sleep(20 * time.Millisecond) // sleep: poll (the count must hold for most of the window)
	}
	poll.Until(t, pollTimeout, 20*time.Millisecond, "B scales down the idle function to one", func(context.Context) error {
		if n := len(e.livePods(name)); n != 1 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
	for _, r := range []*replica{a, b} {
		_, m := httpGetBody(t, r.httpAddr, "/metrics")
		if !containsLine(m, "skipper_controller_ownership_moves_total 1") {
			t.Errorf("%s: skipper_controller_ownership_moves_total is not 1", r.name)
		}
	}
	evs, err := e.core.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool { return ev.Reason == "OwnershipTaken" }) {
		t.Error("no OwnershipTaken event")
	}
}

// TestOwnerDeathScalingResumesWithinTwoIntervals: when the owning replica
// dies (its endpoint leaves the Service), the next owner takes the function
// over and acts on load within two scale intervals.
func TestOwnerDeathScalingResumesWithinTwoIntervals(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	la, lb := listen(t), listen(t)
	name := functionOwnedBy(t, la, la, lb)
	fn := e.fnFor(name, "echo")
	fn.Spec.Scaling.TargetInFlight = 1
	e.add(sliceOf("ctl-a", la), sliceOf("ctl-b", lb), poolDeploy("echo"), fn)
	for i := range 4 {
		e.add(poolPod(fmt.Sprintf("p%d", i), "echo"))
	}
	const interval = 300 * time.Millisecond
	cfg := func(c *Config) { c.ScaleInterval, c.StatusInterval = interval, 10*time.Millisecond }
	a := startReplica(t, e, "ctl-a", la, cfg)
	b := startReplica(t, e, "ctl-b", lb, cfg)
	poll.Until(t, pollTimeout, pollInterval, "both replicas see a two-member ring", func(context.Context) error { return ringMembers(t, 2, a, b) })
	if resp, err := getInstance(t.Context(), a, name, nil); err != nil || resp.GetOwner() != "ctl-a" {
		t.Fatalf("GetInstance = %v, %v; want owner ctl-a", resp, err)
	}

	// A dies: its process ends and its endpoint leaves the Service.
	a.stop()
	if err := e.core.DiscoveryV1().EndpointSlices(systemNS).Delete(t.Context(), "ctl-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	died := time.Now()
	router := connectRouter(t, b, "skipper-system/router-d")
	poll.Until(t, 2*interval-time.Since(died), pollInterval, "B scaling the function up within two intervals of the owner's death", func(ctx context.Context) error {
		router.report(name, 3, nil) // the router reports to the owner by its own view: now B
		st, err := b.client.GetState(ctx, &skipperv1.GetStateRequest{Function: &skipperv1.FunctionRef{Namespace: "default", Name: name}})
		if err != nil {
			return err
		}
		if fs := st.GetFunctions(); len(fs) != 1 || fs[0].GetDesired() != 3 {
			return fmt.Errorf("functions %v", fs)
		}
		return nil
	})
	t.Logf("B decided to scale up %s after A died", time.Since(died).Round(time.Millisecond))
	poll.Until(t, pollTimeout, pollInterval, "B's three instances", func(context.Context) error {
		if n := len(e.livePods(name)); n != 3 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
}

// forget deleting a function's instance series while its supervisor still
// runs (ownership left and came back before the supervisor noticed) must
// not leave the function without series: the supervisor writes them again.
func TestInstanceSeriesRewrittenAfterForget(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("hello", "echo")
	fn.Spec.MinInstances, fn.Spec.MaxInstances = 1, 2
	e.add(poolDeploy("echo"), fn, poolPod("p0", "echo"), poolPod("p1", "echo"))
	c := startController(t, e, func(c *Config) { c.ScaleInterval = 20 * time.Millisecond })
	series := func(context.Context) error {
		fams, err := c.metrics.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == "skipper_controller_instances" && len(f.GetMetric()) > 0 {
				return nil
			}
		}
		return errors.New("no skipper_controller_instances series")
	}
	poll.Until(t, pollTimeout, pollInterval, "instance series of the supervised function", series)
	c.forget("default/hello", false, false)
	poll.Until(t, pollTimeout, pollInterval, "instance series written again after forget", series)
}

// TestReleaseOfInstanceClaimedBeforeOwnershipMoved: the replica that owns a
// oneshot function now honours the release of an instance it has never
// seen (the previous owner claimed it moments before the ring changed, and
// this replica's informer does not show the claim yet): it reads the pod
// from the API server instead of refusing.
func TestReleaseOfInstanceClaimedBeforeOwnershipMoved(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("once", "echo")
	fn.Spec.Oneshot = true
	e.add(poolDeploy("echo"), fn)
	staleInformer(e) // this replica's pod informer never hears of the claim
	r := startReplica(t, e, "ctl-0", nil, nil)
	router := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a", Incarnation: "i1"}
	e.add(poolPod("claimed-elsewhere", "echo", claimedBy(fn), annotated(annOneshotRouter, router.GetPod())))

	release := func(who *skipperv1.RouterIdentity) error {
		_, err := r.client.ReleaseInstance(t.Context(), &skipperv1.ReleaseInstanceRequest{
			Function: &skipperv1.FunctionRef{Namespace: "default", Name: "once"},
			Router:   who,
			PodUid:   "uid-claimed-elsewhere",
		})
		return err
	}
	other := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-b", Incarnation: "i1"}
	if err := release(other); status.Code(err) != codes.PermissionDenied {
		t.Errorf("release by another router = %v, want PermissionDenied", err)
	}
	if err := release(router); err != nil {
		t.Fatalf("release by its router of an instance this replica's cache lacks: %v", err)
	}
	if _, err := e.core.CoreV1().Pods("default").Get(t.Context(), "claimed-elsewhere", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("released pod: err = %v, want NotFound", err)
	}
}

// blockingAssign is an assign endpoint that holds every request until
// release is called (or the test ends); it returns its port and release.
func blockingAssign(t *testing.T) (port int32, release func(), requests *atomic.Int32) {
	t.Helper()
	gate := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	requests = &atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-gate:
			w.WriteHeader(http.StatusOK)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(release) // runs first: Close waits for handlers
	_, p, _ := net.SplitHostPort(srv.Listener.Addr().String())
	n, _ := strconv.Atoi(p)
	return int32(n), release, requests
}

// TestScaleUpToHugeWantClaimsAtMostTheBound: a scale-up to 2^31-1
// instances (a Function that slipped past validation, a report that asks
// for it) starts no more claims than --max-parallel-claims and the pool's
// candidates allow, tick after tick; goroutines stay bounded.
func TestScaleUpToHugeWantClaimsAtMostTheBound(t *testing.T) { // not parallel: it counts the process's goroutines
	e := newTestEnv(t)
	port, release, requests := blockingAssign(t)
	fn := e.fnFor("huge", "echo")
	fn.Spec.Port = port
	e.add(poolDeploy("echo"), fn)
	for i := range 20 {
		e.add(poolPod(fmt.Sprintf("p%02d", i), "echo"))
	}
	const bound = 4
	c := startController(t, e, func(c *Config) { c.MaxParallelClaims, c.AssignTimeout = bound, 10*time.Second })
	cached, err := c.cache.function("default", "huge")
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	started, most, maxGoroutines := 0, 0, 0
	for range 30 { // ticks
		started += c.scaleUp(cached, port, math.MaxInt32)
		most = max(most, c.claims.inFlight())
		maxGoroutines = max(maxGoroutines, runtime.NumGoroutine())
		time.Sleep(5 * time.Millisecond) // sleep: load (ticks 5ms apart)
	}
	poll.Until(t, pollTimeout, pollInterval, "claims reach the assign endpoint", func(context.Context) error {
		if n := requests.Load(); n != bound {
			return fmt.Errorf("%d assign requests", n)
		}
		return nil
	})
	if started != bound || most != bound {
		t.Errorf("30 scale-ups to 2^31-1 started %d claims, at most %d in flight; want %d", started, most, bound)
	}
	if extra := maxGoroutines - before; extra > 100 {
		t.Errorf("%d goroutines above the baseline with %d claims in flight", extra, bound)
	}
	// Once claims complete, later ticks claim on, never more than the pool
	// holds.
	release()
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "the pool's 20 pods claimed", func(context.Context) error {
		c.scaleUp(cached, port, math.MaxInt32)
		if n := len(e.claimedPods()); n != 20 {
			return fmt.Errorf("%d claimed", n)
		}
		return nil
	})
	// A pod shows as claimed once its claim patch landed; its assign
	// follows.
	poll.Until(t, pollTimeout, pollInterval, "an assign request for each of the 20 claimed pods", func(context.Context) error {
		if n := requests.Load(); n != 20 {
			return fmt.Errorf("%d assign requests", n)
		}
		return nil
	})
	for range 5 {
		if n := c.scaleUp(cached, port, math.MaxInt32); n > 1 {
			t.Errorf("scale-up with an empty pool started %d claims, want at most one waiting", n)
		}
	}
	if n := requests.Load(); n != 20 {
		t.Errorf("%d assign requests for a pool of 20", n)
	}
}

// TestPodReachesRoutersOnlyAfterAssign: a pod whose instance has not
// accepted its assignment is in no instance set and is not written to
// (the instance decides the claim); it reaches routers once the assign
// succeeded, and its record follows.
func TestPodReachesRoutersOnlyAfterAssign(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	port, release, requests := blockingAssign(t)
	fn := e.fnFor("hello", "echo")
	fn.Spec.Port = port
	e.add(poolDeploy("echo"), fn, poolPod("p1", "echo"))
	r := startReplica(t, e, "ctl-0", nil, nil)

	// A router subscribed to the function from its Hello.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := r.client.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a", Incarnation: "i1"}
	if err := stream.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Hello{Hello: &skipperv1.Hello{
		Router: id, Subscriptions: []*skipperv1.Subscription{{Function: ref("default", "hello")}},
	}}}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var served []string // pods any update handed out
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			for _, in := range m.GetUpdate().GetInstances() {
				served = append(served, in.GetPod())
			}
			mu.Unlock()
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	servedPods := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(served)
	}

	type result struct {
		resp *skipperv1.GetInstanceResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := getInstance(context.Background(), r, "hello", id)
		done <- result{resp, err}
	}()
	poll.Until(t, pollTimeout, pollInterval, "the assign request sent", func(context.Context) error {
		if n := requests.Load(); n != 1 {
			return fmt.Errorf("%d assign requests", n)
		}
		return nil
	})
	if _, ok := e.pod("p1").Labels[v1alpha1.LabelFunction]; ok {
		t.Fatal("p1 labelled during its assign: the record comes only after the instance accepted")
	}
	// Nothing handed out while the assign waits (tick after tick, on fake
	// time: TestPodReachesRoutersOnlyAfterItsAssign).
	if got := servedPods(); len(got) != 0 {
		t.Fatalf("routers were handed %v before the instance accepted its assignment", got)
	}
	st, err := r.client.GetState(t.Context(), &skipperv1.GetStateRequest{Function: ref("default", "hello")})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range st.GetFunctions() {
		if len(f.GetInstances()) != 0 {
			t.Fatalf("GetState shows instances %v before the assign succeeded", f.GetInstances())
		}
	}

	release()
	res := <-done
	if res.err != nil || len(res.resp.GetInstances()) != 1 || res.resp.GetInstances()[0].GetPod() != "p1" {
		t.Fatalf("GetInstance = %v, %v; want p1", res.resp, res.err)
	}
	poll.Until(t, pollTimeout, pollInterval, "p1 recorded", func(context.Context) error {
		if st := recordStateOf(e.pod("p1"), "uid-p1", fn); st != recordDone {
			return fmt.Errorf("record state %v", st)
		}
		return nil
	})
	poll.Until(t, pollTimeout, pollInterval, "p1 pushed to the router", func(context.Context) error {
		if got := servedPods(); !slices.Contains(got, "p1") {
			return fmt.Errorf("routers were handed %v", got)
		}
		return nil
	})
}

// TestUnrecordedClaimNeverServedAndRetired: a pod a replica claimed but
// never recorded as assigned (it died in between) is in no instance set;
// once no claim can record it any more, the owner deletes it. One claimed
// just now is left alone.
func TestUnrecordedClaimNeverServedAndRetired(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("hello", "echo")
	marked := func(at time.Time) podOpt {
		return func(p *corev1.Pod) {
			claimedBy(fn)(p)
			annotated(annClaimedAt, at.UTC().Format(time.RFC3339Nano))(p)
			annotated(annAssignPending, "true")(p)
		}
	}
	e.add(poolDeploy("echo"), fn,
		poolPod("stale", "echo", marked(time.Now().Add(-time.Hour))),
		poolPod("fresh", "echo", marked(time.Now())))
	c := startController(t, e, func(c *Config) { c.ScaleInterval = 20 * time.Millisecond })
	cached, err := c.cache.function("default", "hello")
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, pollInterval, "the stale pod deleted", func(ctx context.Context) error { return podGone(ctx, e, "stale") })
	if set := c.currentSet(cached, e.assignPort, nil); len(set) != 0 {
		t.Errorf("instance set %v, want none: neither pod's assignment is recorded", set)
	}
	if _, err := e.core.CoreV1().Pods("default").Get(t.Context(), "fresh", metav1.GetOptions{}); err != nil {
		t.Errorf("the pod claimed just now: %v; want it kept while its claim may still record it", err)
	}
}

func TestClaimLimiter(t *testing.T) {
	t.Parallel()
	var none *claimLimiter
	if err := none.admit("any", time.Now()); err != nil {
		t.Errorf("nil limiter: %v", err)
	}
	l := newClaimLimiter(1, 2)
	now := time.Now()
	for i := range 2 {
		if err := l.admit("a", now); err != nil {
			t.Fatalf("claim %d within the burst: %v", i, err)
		}
	}
	err := l.admit("a", now)
	if !errors.Is(err, ErrClaimRateLimited) || grpcStatus(err).Code() != codes.ResourceExhausted {
		t.Fatalf("claim past the burst: %v, want ErrClaimRateLimited as ResourceExhausted", err)
	}
	if err := l.admit("b", now); err != nil {
		t.Errorf("another caller: %v", err)
	}
	// Idle buckets are dropped once refilled (burst/qps = 2s).
	if err := l.admit("c", now.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := l.callers(); n != 1 {
		t.Errorf("%d callers held after the others idled, want 1", n)
	}
	// Callers beyond the bound share one bucket: memory stays bounded.
	big := newClaimLimiter(1e9, 1e9)
	for i := range maxLimiterCallers + 100 {
		_ = big.admit(strconv.Itoa(i), now)
	}
	if n := big.callers(); n != maxLimiterCallers {
		t.Errorf("%d callers held, want at most %d", n, maxLimiterCallers)
	}
}

// TestClaimRateLimitPerRouter: one router's GetInstance calls start at most
// --claim-burst-per-router claims at once and get ResourceExhausted with a
// reason beyond; another router is not affected.
func TestClaimRateLimitPerRouter(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	fn := e.fnFor("once", "echo")
	fn.Spec.Oneshot = true // every call claims
	e.add(poolDeploy("echo"), fn, poolPod("p1", "echo"), poolPod("p2", "echo"), poolPod("p3", "echo"))
	r := startReplica(t, e, "ctl-0", nil, func(c *Config) { c.ClaimRatePerRouter, c.ClaimBurstPerRouter = 0.001, 1 })
	routerA := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a", Incarnation: "i1"}
	routerB := &skipperv1.RouterIdentity{Node: "node-2", Pod: "skipper-system/router-b", Incarnation: "i1"}
	if _, err := getInstance(t.Context(), r, "once", routerA); err != nil {
		t.Fatalf("first claim: %v", err)
	}
	_, err := getInstance(t.Context(), r, "once", routerA)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "claims") {
		t.Fatalf("second claim of router a: %v, want ResourceExhausted with a reason", err)
	}
	// Renaming itself in the message gains router a nothing: claims are
	// charged to its address.
	renamed := &skipperv1.RouterIdentity{Node: "node-1", Pod: "skipper-system/router-a-renamed", Incarnation: "i2"}
	if _, err := getInstance(t.Context(), r, "once", renamed); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("router a under another name: %v, want ResourceExhausted", err)
	}
	// Router b calls from an address of its own.
	fromB := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext
	conn, err := grpc.NewClient("passthrough:///"+r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return fromB(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := skipperv1.NewControllerClient(conn).GetInstance(t.Context(), &skipperv1.GetInstanceRequest{
		Function: &skipperv1.FunctionRef{Namespace: "default", Name: "once"}, Router: routerB,
	}); err != nil {
		t.Fatalf("router b: %v", err)
	}
	poll.Until(t, pollTimeout, pollInterval, "two claims recorded", func(context.Context) error {
		if n := len(e.claimedPods()); n < 2 {
			return fmt.Errorf("%d claimed", n)
		}
		return nil
	})
	if n := len(e.claimedPods()); n != 2 {
		t.Errorf("%d pods claimed, want 2", n)
	}
	_, body := httpGetBody(t, r.httpAddr, "/metrics")
	if want := `skipper_controller_assignments_total{function="default/once",result="limited"} 2`; !strings.Contains(body, want) {
		t.Errorf("/metrics lacks %q", want)
	}
}
