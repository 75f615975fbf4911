package controller

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/scaling"
)

// planSummary is what a test compares of a plan.
type planSummary struct {
	Instances                    int32
	Reason                       scaling.Reason
	Current, Pending             int
	Ready, NotReady, Terminating int
	Retire, Victims              []string
	InFlight                     int64
	Keep                         bool
	Reassign, Probe              []string
}

func summarize(p plan) planSummary {
	s := planSummary{
		Instances: p.decision.Instances, Reason: p.decision.Reason,
		Current: p.current, Pending: p.pending,
		Ready: p.ready, NotReady: p.notReady, Terminating: p.terminating,
		Retire: names(p.retire), InFlight: p.load.InFlight, Keep: p.keep,
	}
	for _, v := range p.victims {
		s.Victims = append(s.Victims, v.Pod.Name)
	}
	s.Reassign = names(p.reassign)
	for _, u := range p.probe {
		s.Probe = append(s.Probe, string(u))
	}
	return s
}

// testWindow is a report window created at created, with one router's
// report of inFlight sent at t0 and activity at active (zero: none).
func testWindow(created, active time.Time, inFlight int64) *scaling.Window {
	w := scaling.NewWindow(created)
	if inFlight > 0 {
		w.Observe(t0, scaling.Report{Router: scaling.RouterID{Pod: "r", Incarnation: "i"}, Sequence: 1, Sent: t0, InFlight: inFlight})
	}
	if !active.IsZero() {
		w.Touch(active)
	}
	return w
}

func TestDecidePlan(t *testing.T) {
	t.Parallel()
	cfg := validConfig()
	cfg.HeartbeatTimeout, cfg.ReportInterval, cfg.OneshotLease = 3*time.Second, time.Second, time.Minute
	cfg.ClaimTimeout, cfg.AssignTimeout = 10*time.Second, 5*time.Second
	cfg.ScaleDownStabilization = 0 // none
	fn := testFunction("hello")
	fn.Spec.MaxInstances, fn.Spec.Scaling.TargetInFlight = 10, 10
	inst := func(name string, opts ...podOpt) *corev1.Pod {
		return testPod(name, append([]podOpt{claimedBy(fn), annotated(annClaimRestarts, "2")}, opts...)...)
	}
	claimed := func(at time.Time) podOpt { return annotated(annClaimedAt, at.Format(time.RFC3339Nano)) }
	warm, recent := t0.Add(-time.Hour), t0.Add(-time.Second)
	for _, tt := range []struct {
		name     string
		fn       func(*v1alpha1.Function)
		pods     []*corev1.Pod
		claims   claimView
		window   *scaling.Window
		draining []types.UID
		portErr  error
		want     planSummary
	}{
		{
			name:   "idle and empty: the supervisor stops",
			window: testWindow(warm, time.Time{}, 0),
			want:   planSummary{Reason: scaling.ReasonIdle},
		},
		{
			name:   "minInstances keeps it",
			fn:     func(f *v1alpha1.Function) { f.Spec.MinInstances = 2 },
			window: testWindow(warm, time.Time{}, 0),
			want:   planSummary{Instances: 2, Reason: scaling.ReasonMinInstances, Keep: true},
		},
		{
			name:   "load scales up from zero",
			window: testWindow(warm, recent, 25),
			want:   planSummary{Instances: 3, Reason: scaling.ReasonInFlight, InFlight: 25, Keep: true},
		},
		{
			name: "ready, not ready and terminating counted; other pods ignored; the not ready withdrawn first",
			pods: []*corev1.Pod{
				inst("a"), inst("b", notReady), inst("c", terminating),
				testPod("pool"), testPod("other", labelled(v1alpha1.LabelFunction, "other")), inst("unowned", noOwners),
			},
			window: testWindow(warm, recent, 0),
			want: planSummary{Instances: 1, Reason: scaling.ReasonActive, Current: 2, Ready: 1, NotReady: 1, Terminating: 1,
				Victims: []string{"b"}, Keep: true},
		},
		{
			name: "assumed once, reserved as its flight, retired not at all",
			pods: []*corev1.Pod{inst("a"), inst("n", annotated(annAssignPending, "x")), inst("r"), inst("x")},
			claims: claimView{
				Assumed:  []*corev1.Pod{claimedCopy(testPod("n"), fn, claimInfo{At: t0, Restarts: 2})},
				Reserved: []types.UID{"uid-r"}, Retired: []types.UID{"uid-x"}, InFlight: 1,
			},
			window: testWindow(warm, recent, 25),
			want:   planSummary{Instances: 3, Reason: scaling.ReasonInFlight, Current: 3, Pending: 1, Ready: 2, InFlight: 25, Keep: true},
		},
		{
			// Routers report uid-q, no instance here: asked. Instances, the
			// assumed and the reserved are not; the callers changed, so the
			// recorded instance is assigned again (not the assumed one,
			// whose record carries them, nor the reserved one).
			name: "reported pods that are no instance here are probed; instances of old callers re-assigned",
			fn:   func(f *v1alpha1.Function) { f.Spec.Callers = v1alpha1.Callers{Namespaces: []string{"team-a"}} },
			pods: []*corev1.Pod{inst("a"), inst("r")},
			claims: claimView{
				Assumed:  []*corev1.Pod{claimedCopy(testPod("n"), fn, claimInfo{At: t0, Restarts: 2, Callers: callersDigest(&v1alpha1.Callers{Namespaces: []string{"team-a"}})})},
				Reserved: []types.UID{"uid-r"},
			},
			window: func() *scaling.Window {
				w := testWindow(warm, recent, 0)
				w.Observe(t0, scaling.Report{Router: scaling.RouterID{Pod: "r2", Incarnation: "i"}, Sequence: 1, Sent: t0,
					Instances: []scaling.InstanceReport{{PodUID: "uid-a"}, {PodUID: "uid-n"}, {PodUID: "uid-r"}, {PodUID: "uid-q"}}})
				return w
			}(),
			want: planSummary{Instances: 1, Reason: scaling.ReasonActive, Current: 2, Ready: 2, Keep: true, Victims: []string{"n"},
				Reassign: []string{"a"}, Probe: []string{"uid-q"}},
		},
		{
			name:     "a restarted instance is retired, unless it drains",
			pods:     []*corev1.Pod{inst("a", annotated(annClaimRestarts, "0")), inst("b", annotated(annClaimRestarts, "1"))},
			draining: []types.UID{"uid-b"},
			window:   testWindow(warm, time.Time{}, 0),
			want:     planSummary{Reason: scaling.ReasonIdle, Retire: []string{"a"}, Keep: true},
		},
		{
			name:   "an assignment never recorded is retired after the grace",
			pods:   []*corev1.Pod{inst("old", annotated(annAssignPending, "x"), claimed(t0.Add(-time.Hour))), inst("new", annotated(annAssignPending, "x"), claimed(t0))},
			window: testWindow(warm, recent, 0),
			want:   planSummary{Instances: 1, Reason: scaling.ReasonActive, Current: 1, NotReady: 1, Retire: []string{"old"}, Keep: true},
		},
		{
			name:   "oneshot: past its lease retired, nothing scaled",
			fn:     func(f *v1alpha1.Function) { f.Spec.Oneshot = true },
			pods:   []*corev1.Pod{inst("spent", claimed(t0.Add(-2*time.Minute))), inst("fresh", claimed(t0))},
			claims: claimView{InFlight: 1},
			window: testWindow(warm, recent, 40),
			want:   planSummary{Instances: 2, Reason: "oneshot", Current: 2, Pending: 1, Ready: 1, Retire: []string{"spent"}, InFlight: 40, Keep: true},
		},
		{
			name:    "no pool: no victims",
			pods:    []*corev1.Pod{inst("a"), inst("b")},
			portErr: errors.New("pool not found"),
			window:  testWindow(warm, recent, 0),
			want:    planSummary{Instances: 1, Reason: scaling.ReasonActive, Current: 2, Ready: 2, Keep: true},
		},
		{
			name:   "a new owner warming up holds what it found",
			pods:   []*corev1.Pod{inst("a"), inst("b")},
			window: testWindow(t0.Add(-time.Second), time.Time{}, 0),
			want:   planSummary{Instances: 2, Reason: scaling.ReasonOwnerWarmup, Current: 2, Ready: 2, Keep: true},
		},
		{
			name:     "drains keep it",
			draining: []types.UID{"uid-gone"},
			window:   testWindow(warm, time.Time{}, 0),
			want:     planSummary{Reason: scaling.ReasonIdle, Keep: true},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := fn.DeepCopy()
			if tt.fn != nil {
				tt.fn(f)
			}
			in := planInput{
				Now: t0, Function: f, Port: 8080, PortErr: tt.portErr,
				Pods: tt.pods, Claims: tt.claims, Window: tt.window, Draining: map[types.UID]*drain{},
			}
			for _, uid := range tt.draining {
				in.Draining[uid] = &drain{}
			}
			var buf planBuffers
			got := decidePlan(in, planPolicyOf(f, &cfg), &buf)
			if diff := cmp.Diff(tt.want, summarize(got)); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			if got.port != 8080 || !errors.Is(got.portErr, tt.portErr) {
				t.Errorf("port %d, %v; want the input's", got.port, got.portErr)
			}
			// The same snapshot, the same plan: decidePlan keeps nothing
			// but what it returns.
			if again := decidePlan(in, planPolicyOf(f, &cfg), &buf); !cmp.Equal(summarize(got), summarize(again)) {
				t.Errorf("a second plan of the same input differs: %+v", summarize(again))
			}
		})
	}
}

// TestDecidePlanHistory: the decision's history is the next tick's; a
// oneshot plan keeps the history it was given.
func TestDecidePlanHistory(t *testing.T) {
	t.Parallel()
	cfg := validConfig()
	cfg.ScaleDownStabilization = time.Minute
	fn := testFunction("hello")
	fn.Spec.MaxInstances, fn.Spec.Scaling.TargetInFlight = 10, 10
	in := planInput{Now: t0, Function: fn, Window: testWindow(t0.Add(-time.Hour), t0, 25)}
	first := decidePlan(in, planPolicyOf(fn, &cfg), &planBuffers{})
	if first.decision.Instances != 3 {
		t.Fatalf("first plan: %d instances, want 3", first.decision.Instances)
	}
	// A minute later the load is gone, still within the stabilization
	// window of the first: the history holds the scale at 3.
	in.Now, in.History, in.Window = t0.Add(30*time.Second), first.history, testWindow(t0.Add(-time.Hour), t0.Add(30*time.Second), 0)
	for range 3 {
		in.Claims.InFlight++ // the three claims the first plan asked for
	}
	if p := decidePlan(in, planPolicyOf(fn, &cfg), &planBuffers{}); p.decision.Instances != 3 || p.decision.Reason != scaling.ReasonStabilized {
		t.Errorf("within the window: %d (%s), want 3 (stabilized)", p.decision.Instances, p.decision.Reason)
	}
	in.History = scaling.History{}
	if p := decidePlan(in, planPolicyOf(fn, &cfg), &planBuffers{}); p.decision.Instances != 1 {
		t.Errorf("without the history: %d, want 1", p.decision.Instances)
	}
	fn.Spec.Oneshot = true
	if p := decidePlan(in, planPolicyOf(fn, &cfg), &planBuffers{}); p.history != in.History {
		t.Error("a oneshot plan changed the history")
	}
}
