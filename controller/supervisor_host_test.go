package controller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/scaling"
)

// fakeHost is a supervisorHost that serves the snapshot it is given and
// records what the supervisor carries out.
type fakeHost struct {
	mu      sync.Mutex
	in      planInput // Now is set per call
	stop    bool      // snapshot says stop
	acks    bool      // every router holds every generation
	gen     uint64
	calls   []string
	desired []int32 // status writes
}

var _ supervisorHost = (*fakeHost)(nil)

func (h *fakeHost) record(format string, a ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, fmt.Sprintf(format, a...))
}

func (h *fakeHost) took() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.calls
	h.calls = nil
	return out
}

func (h *fakeHost) snapshot(key string, now time.Time) (planInput, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	in := h.in
	in.Now = now
	return in, !h.stop
}

func (h *fakeHost) scaleUp(fn *v1alpha1.Function, port int32, want int) int {
	h.record("scaleUp %d", want)
	return want
}

func (h *fakeHost) withdraw(fn *v1alpha1.Function, port int32, pods []*corev1.Pod, now, until time.Time) uint64 {
	h.mu.Lock()
	h.gen++
	gen := h.gen
	h.mu.Unlock()
	h.record("withdraw %v", names(pods))
	return gen
}

func (h *fakeHost) remove(ctx context.Context, pod *corev1.Pod, reason string, until time.Time) {
	h.record("remove %s: %s", pod.Name, reason)
}

func (h *fakeHost) reassign(fn *v1alpha1.Function, port int32, pods []*corev1.Pod) {
	for _, p := range pods {
		h.record("reassign %s", p.Name)
	}
}

func (h *fakeHost) probe(fn *v1alpha1.Function, port int32, uids []types.UID) {
	for _, u := range uids {
		h.record("probe %s", u)
	}
}

func (h *fakeHost) acked(key string, gen uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.acks
}

func (h *fakeHost) event(fn *v1alpha1.Function, typ, reason, format string, a ...any) {
	h.record("event %s", reason)
}

func (h *fakeHost) writeStatus(ctx context.Context, fn *v1alpha1.Function, v statusView, now time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.desired = append(h.desired, v.desired)
	return nil
}

// TestSupervisorThroughHost runs a supervisor's ticks against a fake
// host, without a controller: a report that starts it scales up on its
// first tick (it does not stop there), idleness scales down to zero
// through drains that end once the routers acknowledged and a report
// interval passed, a restarted instance is retired, and a snapshot that
// says stop stops it.
func TestSupervisorThroughHost(t *testing.T) {
	t.Parallel()
	cfg := validConfig()
	cfg.HeartbeatTimeout, cfg.ReportInterval, cfg.ScaleDownStabilization = 3*time.Second, time.Second, 0
	fn := testFunction("hello")
	fn.Spec.MaxInstances, fn.Spec.Scaling.TargetInFlight = 10, 10
	h := &fakeHost{in: planInput{Function: fn, Port: 8080}}
	s := newSupervisor(h, &cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(), fn.Key(), fn, t0)
	s.window.Observe(t0, scaling.Report{Router: scaling.RouterID{Pod: "r", Incarnation: "i"}, Sequence: 1, Sent: t0, InFlight: 25})
	ctx := t.Context()

	step := func(now time.Time, wantKeep bool, want ...string) {
		t.Helper()
		if keep := s.tick(ctx, now); keep != wantKeep {
			t.Errorf("tick at %v: keep %v, want %v", now.Sub(t0), keep, wantKeep)
		}
		if diff := cmp.Diff(want, h.took()); diff != "" {
			t.Errorf("tick at %v (-want +got):\n%s", now.Sub(t0), diff)
		}
	}
	step(t0, true, "scaleUp 3", "event ScaledUp")

	inst := func(name string) *corev1.Pod {
		return testPod(name, claimedBy(fn), annotated(annClaimRestarts, "2"))
	}
	h.mu.Lock()
	h.in.Pods = []*corev1.Pod{inst("a"), inst("b"), inst("c")}
	h.mu.Unlock()
	step(t0.Add(time.Second), true) // at its count: nothing to do

	// Idle: the report is past the heartbeat timeout, the activity past
	// idleTimeout. Every instance is withdrawn and drains.
	idle := t0.Add(2 * time.Minute)
	step(idle, true, "withdraw [a b c]", "event ScaledDown")
	if len(s.drains) != 3 {
		t.Fatalf("%d drains, want 3", len(s.drains))
	}
	// The routers have not acknowledged: the drains wait.
	h.mu.Lock()
	h.in.Claims.Retired = []types.UID{"uid-a", "uid-b", "uid-c"}
	h.mu.Unlock()
	step(idle.Add(time.Second), true)
	h.mu.Lock()
	h.acks = true
	h.mu.Unlock()
	step(idle.Add(2*time.Second), true) // acknowledged now; quiet a report interval later
	if !s.tick(ctx, idle.Add(3*time.Second)) {
		t.Error("the supervisor stopped while it had drains")
	}
	if diff := cmp.Diff([]string{"remove a: drained", "remove b: drained", "remove c: drained"}, slices.Sorted(slices.Values(h.took()))); diff != "" {
		t.Errorf("drains ended (-want +got):\n%s", diff)
	}

	// Gone from the cache: nothing left, the supervisor stops.
	h.mu.Lock()
	h.in.Pods, h.in.Claims = nil, claimView{}
	h.mu.Unlock()
	step(idle.Add(4*time.Second), false)

	// A restarted instance is withdrawn, removed and reported.
	h.mu.Lock()
	h.in.Pods = []*corev1.Pod{testPod("r", claimedBy(fn), annotated(annClaimRestarts, "0"))}
	h.mu.Unlock()
	step(idle.Add(5*time.Second), false, "withdraw [r]", "remove r: its container restarted since it was claimed", "event InstanceRetired")

	h.mu.Lock()
	h.stop = true
	h.mu.Unlock()
	step(idle.Add(6*time.Second), false)
	if !slices.Equal(h.desired, []int32{3, 3, 0, 0, 0, 0, 0, 0}) {
		t.Errorf("status desired %v, want 3 twice then 0", h.desired)
	}
}
