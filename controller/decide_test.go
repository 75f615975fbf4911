package controller

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func ptr[T any](v T) *T { return &v }

func slice(name string, port *int32, portName string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Endpoints: eps}
	if port != nil {
		s.Ports = []discoveryv1.EndpointPort{{Name: ptr(portName), Port: port}}
	}
	return s
}

func ep(addr string, ready, terminating *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ready, Terminating: terminating}}
}

func testFunction(name string) *v1alpha1.Function {
	return &v1alpha1.Function{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("fn-" + name)},
		Spec:       v1alpha1.FunctionSpec{Pool: "echo", MaxInstances: 3},
	}
}

type podOpt func(*corev1.Pod)

func testPod(name string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1",
			Labels: map[string]string{v1alpha1.LabelPool: "echo", "pod-template-hash": "abc"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "echo-abc", UID: "rs-uid", Controller: ptr(true),
			}},
		},
		Spec: corev1.PodSpec{NodeName: "node-1"},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "198.18.1.10", StartTime: ptr(metav1.NewTime(t0)),
			ContainerStatuses: []corev1.ContainerStatus{{Name: "main", RestartCount: 1}, {Name: "side", RestartCount: 1}},
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0)}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func claimedBy(fn *v1alpha1.Function) podOpt {
	return func(p *corev1.Pod) {
		p.Labels[v1alpha1.LabelFunction] = fn.Name
		p.OwnerReferences = append(p.OwnerReferences, functionOwnerRef(fn))
	}
}
func notReady(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }
func terminating(p *corev1.Pod) {
	now := metav1.NewTime(t0)
	p.DeletionTimestamp = &now
}
func onNode(n string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }
func annotated(k, v string) podOpt {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[k] = v
	}
}
func ip(a string) podOpt { return func(p *corev1.Pod) { p.Status.PodIP = a } }
func readyAt(at time.Time) podOpt {
	return func(p *corev1.Pod) { p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(at) }
}
func pooled(pool string) podOpt        { return func(p *corev1.Pod) { p.Labels[v1alpha1.LabelPool] = pool } }
func pending(p *corev1.Pod)            { p.Status.Phase = corev1.PodPending }
func noOwners(p *corev1.Pod)           { p.OwnerReferences = nil }
func labelled(k, v string) podOpt      { return func(p *corev1.Pod) { p.Labels[k] = v } }
func resourceVersion(rv string) podOpt { return func(p *corev1.Pod) { p.ResourceVersion = rv } }

func TestInstanceSet(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	other := testFunction("other")
	recreated := testFunction("hello")
	recreated.UID = "fn-hello-old"
	tests := []struct {
		name     string
		pods     []*corev1.Pod
		assumed  []*corev1.Pod
		unusable []string
		want     []instance
	}{
		{name: "no pods"},
		{
			name: "ready claimed pods, sorted by name",
			pods: []*corev1.Pod{testPod("b", claimedBy(fn), ip("198.18.1.11"), onNode("node-2")), testPod("a", claimedBy(fn))},
			want: []instance{
				{Pod: "a", UID: "uid-a", Address: "198.18.1.10:8080", Node: "node-1"},
				{Pod: "b", UID: "uid-b", Address: "198.18.1.11:8080", Node: "node-2"},
			},
		},
		{
			name: "not ready, terminating, pending, unclaimed and other functions' pods are left out",
			pods: []*corev1.Pod{
				testPod("nr", claimedBy(fn), notReady), testPod("term", claimedBy(fn), terminating),
				testPod("pend", claimedBy(fn), pending), testPod("pool"), testPod("o", claimedBy(other)),
			},
		},
		{
			name: "a label without an ownerReference to this Function's UID is not an instance",
			pods: []*corev1.Pod{testPod("stale", claimedBy(recreated))},
		},
		{
			name:    "assumed claims count until the informer shows them",
			assumed: []*corev1.Pod{testPod("new", claimedBy(fn))},
			want:    []instance{{Pod: "new", UID: "uid-new", Address: "198.18.1.10:8080", Node: "node-1"}},
		},
		{
			name:    "the informer's copy wins over the assumed one",
			pods:    []*corev1.Pod{testPod("new", claimedBy(fn), notReady)},
			assumed: []*corev1.Pod{testPod("new", claimedBy(fn))},
		},
		{
			name: "a pod marked assign-pending is left out: its assignment is not recorded",
			pods: []*corev1.Pod{testPod("a", claimedBy(fn), annotated(annAssignPending, "true")), testPod("b", claimedBy(fn))},
			want: []instance{{Pod: "b", UID: "uid-b", Address: "198.18.1.10:8080", Node: "node-1"}},
		},
		{
			name:    "this replica's record of the assignment stands in for the informer's marked copy",
			pods:    []*corev1.Pod{testPod("new", claimedBy(fn), annotated(annAssignPending, "true"), ip("198.18.1.11"))},
			assumed: []*corev1.Pod{testPod("new", claimedBy(fn))},
			want:    []instance{{Pod: "new", UID: "uid-new", Address: "198.18.1.10:8080", Node: "node-1"}},
		},
		{
			name:    "a marked assumed copy is not served either",
			assumed: []*corev1.Pod{testPod("new", claimedBy(fn), annotated(annAssignPending, "true"))},
		},
		{
			name:     "unusable pods are left out",
			pods:     []*corev1.Pod{testPod("a", claimedBy(fn)), testPod("b", claimedBy(fn))},
			unusable: []string{"uid-a"},
			want:     []instance{{Pod: "b", UID: "uid-b", Address: "198.18.1.10:8080", Node: "node-1"}},
		},
		{
			name: "IPv6 pod address",
			pods: []*corev1.Pod{testPod("a", claimedBy(fn), ip("fd00::10"))},
			want: []instance{{Pod: "a", UID: "uid-a", Address: "[fd00::10]:8080", Node: "node-1"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := instanceSet(fn, 8080, tt.pods, tt.assumed, tt.unusable)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("instanceSet (-want +got):\n%s", diff)
			}
		})
	}
}

func names(ps []*corev1.Pod) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

func TestClaimCandidates(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	tests := []struct {
		name       string
		pods       []*corev1.Pod
		preferNode string
		exclude    map[string]bool
		mine       func(uid string) bool
		want       []string
	}{
		{name: "empty pool"},
		{
			name: "only ready unclaimed pods of the pool",
			pods: []*corev1.Pod{
				testPod("ok"), testPod("nr", notReady), testPod("term", terminating), testPod("pend", pending),
				testPod("claimed", claimedBy(fn)), testPod("otherpool", pooled("other")), testPod("noip", ip("")),
			},
			want: []string{"ok"},
		},
		{
			name: "longest ready first, then by name",
			pods: []*corev1.Pod{testPod("c", readyAt(t0)), testPod("b", readyAt(t0.Add(time.Second))), testPod("a", readyAt(t0))},
			want: []string{"a", "c", "b"},
		},
		{
			name:       "the caller's node first",
			pods:       []*corev1.Pod{testPod("a", readyAt(t0)), testPod("b", onNode("node-2"), readyAt(t0.Add(time.Hour)))},
			preferNode: "node-2",
			want:       []string{"b", "a"},
		},
		{
			name: "the pods the ring gives this replica first, then the caller's node",
			pods: []*corev1.Pod{
				testPod("a", readyAt(t0)), testPod("b", onNode("node-2"), readyAt(t0.Add(time.Hour))),
				testPod("c", readyAt(t0.Add(time.Minute))), testPod("d", onNode("node-2"), readyAt(t0.Add(2*time.Hour))),
			},
			preferNode: "node-2",
			mine:       func(uid string) bool { return uid == "uid-c" || uid == "uid-d" },
			want:       []string{"d", "c", "b", "a"},
		},
		{
			name:    "excluded (assumed claimed) pods are skipped",
			pods:    []*corev1.Pod{testPod("a"), testPod("b")},
			exclude: map[string]bool{"uid-a": true},
			want:    []string{"b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := names(claimCandidates("echo", tt.pods, tt.preferNode, tt.exclude, tt.mine))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("claimCandidates (-want +got):\n%s", diff)
			}
		})
	}
}

// applyPatch applies patch to pod as the API server would.
func applyPatch(t *testing.T, pod *corev1.Pod, patch []byte) (*corev1.Pod, error) {
	t.Helper()
	js, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("decode patch: %v", err)
	}
	out, err := p.Apply(js)
	if err != nil {
		return nil, err
	}
	var got corev1.Pod
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	return &got, nil
}

func TestRecordPatch(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	statusWritten := func(p *corev1.Pod) {
		p.ResourceVersion = "7"
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: "Other", Status: corev1.ConditionTrue})
	}
	tests := []struct {
		name    string
		cached  *corev1.Pod
		live    *corev1.Pod // the pod as the API server holds it
		wantErr bool
	}{
		{name: "unchanged pod with a ReplicaSet owner", cached: testPod("p"), live: testPod("p")},
		{name: "unchanged pod without ownerReferences", cached: testPod("p", noOwners), live: testPod("p", noOwners)},
		{
			name:   "pod with annotations",
			cached: testPod("p", annotated("a/b", "c")), live: testPod("p", annotated("a/b", "c")),
		},
		// Issue 15: the kubelet's status writes must not fail a record
		// of a claim the instance already decided.
		{name: "status written since it was read", cached: testPod("p"), live: testPod("p", statusWritten)},
		{name: "claimed meanwhile by another function", cached: testPod("p"), live: testPod("p", claimedBy(testFunction("other"))), wantErr: true},
		{
			name:   "function label added without a resourceVersion change is still caught",
			cached: testPod("p"), live: testPod("p", labelled(v1alpha1.LabelFunction, "x")), wantErr: true,
		},
		{
			name:   "owners changed since it was read",
			cached: testPod("p"), live: testPod("p", func(p *corev1.Pod) { p.OwnerReferences[0].Name = "rs-2" }), wantErr: true,
		},
		{
			name:   "another pod of the same name",
			cached: testPod("p"), live: testPod("p", func(p *corev1.Pod) { p.UID = "uid-other" }), wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info := claimInfo{At: t0.Add(time.Minute), Restarts: 2, Router: "router-a"}
			patch, err := recordPatch(tt.cached, fn, info)
			if err != nil {
				t.Fatal(err)
			}
			got, err := applyPatch(t, tt.live, patch)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("patch applied to %s, want a failed test op", tt.name)
				}
				return
			}
			if err != nil {
				t.Fatalf("apply: %v", err)
			}
			if got.Labels[v1alpha1.LabelFunction] != fn.Name {
				t.Errorf("function label = %q, want %q", got.Labels[v1alpha1.LabelFunction], fn.Name)
			}
			want := append(append([]metav1.OwnerReference(nil), tt.live.OwnerReferences...), functionOwnerRef(fn))
			if diff := cmp.Diff(want, got.OwnerReferences); diff != "" {
				t.Errorf("ownerReferences (-want +got):\n%s", diff)
			}
			if recordStateOf(got, tt.cached.UID, fn) != recordDone {
				t.Errorf("recorded pod: state %v, want recordDone", recordStateOf(got, tt.cached.UID, fn))
			}
			wantAnn := map[string]string{annClaimedAt: info.At.UTC().Format(time.RFC3339Nano), annClaimRestarts: "2", annOneshotRouter: "router-a"}
			for k, v := range tt.live.Annotations {
				wantAnn[k] = v
			}
			if diff := cmp.Diff(wantAnn, got.Annotations); diff != "" {
				t.Errorf("annotations (-want +got):\n%s", diff)
			}
			if !claimedAt(got).Equal(info.At) || restartedSinceClaim(got) {
				t.Errorf("claimedAt %s restarted %v, want %s and false", claimedAt(got), restartedSinceClaim(got), info.At)
			}
			// What the controller assumed until the record landed is what
			// the record made of the pod.
			assumed := claimedCopy(tt.live, fn, info)
			if diff := cmp.Diff(assumed.ObjectMeta, got.ObjectMeta); diff != "" {
				t.Errorf("assumed copy and recorded pod differ (-assumed +recorded):\n%s", diff)
			}
			if len(instanceSet(fn, 8080, []*corev1.Pod{got}, nil, nil)) != 1 || len(instanceSet(fn, 8080, nil, []*corev1.Pod{assumed}, nil)) != 1 {
				t.Error("a recorded or assumed pod is not served")
			}
			if _, err := applyPatch(t, got, patch); err == nil {
				t.Error("the record patch applied twice; want a failed labels test")
			}
			got.Status.ContainerStatuses[1].RestartCount++
			if !restartedSinceClaim(got) {
				t.Error("a restart after the claim is not seen")
			}
			got.Status.ContainerStatuses[1].RestartCount--
			got.Status.InitContainerStatuses = append(got.Status.InitContainerStatuses, corev1.ContainerStatus{Name: "skipper-agent", RestartCount: 1})
			if !restartedSinceClaim(got) {
				t.Error("a native sidecar's restart after the claim (the agent's) is not seen")
			}
		})
	}
}

func TestRecordStateOf(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	uid := testPod("p").UID
	terminating := func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: t0} }
	for _, tt := range []struct {
		name string
		pod  *corev1.Pod
		want recordState
	}{
		{"not found", nil, recordPodGone},
		{"another pod of the name", testPod("p", func(p *corev1.Pod) { p.UID = "uid-2" }), recordPodGone},
		{"terminating", testPod("p", terminating), recordPodGone},
		{"pool pod", testPod("p"), recordNeeded},
		{"recorded", testPod("p", claimedBy(fn)), recordDone},
		{"another function's", testPod("p", claimedBy(testFunction("other"))), recordForeign},
		{"labelled without the owner", testPod("p", labelled(v1alpha1.LabelFunction, fn.Name)), recordForeign},
	} {
		if got := recordStateOf(tt.pod, uid, fn); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestAssignStale(t *testing.T) {
	t.Parallel()
	grace := 20 * time.Second
	at := t0.Format(time.RFC3339Nano)
	tests := []struct {
		name string
		pod  *corev1.Pod
		now  time.Time
		want bool
	}{
		{name: "recorded", pod: testPod("p", annotated(annClaimedAt, at)), now: t0.Add(time.Hour)},
		{name: "pending within the grace", pod: testPod("p", annotated(annClaimedAt, at), annotated(annAssignPending, "true")), now: t0.Add(grace - 1)},
		{name: "pending past the grace", pod: testPod("p", annotated(annClaimedAt, at), annotated(annAssignPending, "true")), now: t0.Add(grace), want: true},
		{name: "pending with no claim time", pod: testPod("p", annotated(annAssignPending, "true")), now: t0, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := assignStale(tt.pod, tt.now, grace); got != tt.want {
				t.Errorf("assignStale = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestClaimsToStart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		b    claimBudget
		want int
	}{
		{name: "nothing missing", b: claimBudget{Missing: 0, Candidates: 5, MaxParallel: 8}, want: 0},
		{name: "missing below every bound", b: claimBudget{Missing: 3, Candidates: 5, MaxParallel: 8}, want: 3},
		{name: "bounded by the pool's candidates", b: claimBudget{Missing: 6, Candidates: 2, MaxParallel: 8}, want: 2},
		{name: "bounded by max parallel", b: claimBudget{Missing: 20, Candidates: 20, MaxParallel: 8}, want: 8},
		{name: "max parallel counts other functions' claims", b: claimBudget{Missing: 20, Candidates: 20, InFlight: 5, MaxParallel: 8}, want: 3},
		{name: "replica at its bound", b: claimBudget{Missing: 20, Candidates: 20, InFlight: 8, MaxParallel: 8}, want: 0},
		{name: "above its bound (cold claims) starts none", b: claimBudget{Missing: 20, Candidates: 20, InFlight: 11, MaxParallel: 8}, want: 0},
		{name: "empty pool: one claim waits for a pod", b: claimBudget{Missing: 5, MaxParallel: 8}, want: 1},
		{name: "empty pool, one waiting already", b: claimBudget{Missing: 5, FunctionInFlight: 1, InFlight: 1, MaxParallel: 8}, want: 0},
		{name: "empty pool at the replica's bound", b: claimBudget{Missing: 5, InFlight: 8, MaxParallel: 8}, want: 0},
		{name: "2^31-1 missing", b: claimBudget{Missing: math.MaxInt32, Candidates: 3, MaxParallel: 16}, want: 3},
		{name: "negative missing", b: claimBudget{Missing: -4, Candidates: 3, MaxParallel: 16}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, claimsToStart(tt.b)); diff != "" {
				t.Errorf("claimsToStart(%+v) (-want +got):\n%s", tt.b, diff)
			}
		})
	}
}

func TestRecordPatchRejectsUnusablePod(t *testing.T) {
	t.Parallel()
	fn := testFunction("hello")
	for _, p := range []*corev1.Pod{testPod("p", func(p *corev1.Pod) { p.UID = "" }), {ObjectMeta: metav1.ObjectMeta{Name: "nolabels", UID: "u"}}} {
		if _, err := recordPatch(p, fn, claimInfo{At: t0}); err == nil {
			t.Errorf("recordPatch(%s) succeeded, want an error", p.Name)
		}
	}
}

func TestInstancePort(t *testing.T) {
	t.Parallel()
	pool := func(ports ...int32) *appsv1.Deployment {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "echo"}}
		c := corev1.Container{Name: "main"}
		for _, p := range ports {
			c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: p})
		}
		d.Spec.Template.Spec.Containers = []corev1.Container{c, {Name: "sidecar", Ports: []corev1.ContainerPort{{ContainerPort: 9999}}}}
		return d
	}
	withPort := testFunction("hello")
	withPort.Spec.Port = 7000
	tests := []struct {
		name    string
		fn      *v1alpha1.Function
		pool    *appsv1.Deployment
		want    int32
		wantErr bool
	}{
		{name: "spec.port wins", fn: withPort, pool: pool(8080), want: 7000},
		{name: "first port of the first container", fn: testFunction("hello"), pool: pool(8080, 8081), want: 8080},
		{name: "no port anywhere on the first container", fn: testFunction("hello"), pool: pool(), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := instancePort(tt.fn, tt.pool)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("port = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestPoolDeployment(t *testing.T) {
	t.Parallel()
	d := func(name string, created time.Time, deleting bool) *appsv1.Deployment {
		dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
		if deleting {
			dep.DeletionTimestamp = ptr(metav1.NewTime(created))
		}
		return dep
	}
	tests := []struct {
		name string
		ds   []*appsv1.Deployment
		want string
	}{
		{name: "none", want: ""},
		{name: "oldest", ds: []*appsv1.Deployment{d("b", t0.Add(time.Hour), false), d("c", t0, false)}, want: "c"},
		{name: "tie by name", ds: []*appsv1.Deployment{d("b", t0, false), d("a", t0, false)}, want: "a"},
		{name: "deleting skipped", ds: []*appsv1.Deployment{d("a", t0, true), d("b", t0.Add(time.Hour), false)}, want: "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if p := poolDeployment(tt.ds); p != nil {
				got = p.Name
			}
			if got != tt.want {
				t.Errorf("poolDeployment = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNextGeneration(t *testing.T) {
	t.Parallel()
	now := uint64(t0.UnixMicro())
	tests := []struct {
		name string
		prev uint64
		want uint64
	}{
		{name: "first generation is seeded from the clock", prev: 0, want: now},
		{name: "older than the clock jumps to the clock", prev: now - 100, want: now},
		{name: "ahead of the clock still increases", prev: now + 5, want: now + 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nextGeneration(tt.prev, t0); got != tt.want {
				t.Errorf("nextGeneration(%d) = %d, want %d", tt.prev, got, tt.want)
			}
		})
	}
}

func TestTargetInFlightHonoursConcurrencyLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		target, limit int32
		want          int32
	}{
		{"defaults", 0, 0, v1alpha1.DefaultTargetInFlight},
		{"target only", 4, 0, 4},
		{"limit below the default target", 0, 1, 1},
		{"limit below the target", 8, 3, 3},
		{"limit above the target", 2, 5, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := v1alpha1.FunctionSpec{ConcurrencyLimit: tc.limit}
			spec.Scaling.TargetInFlight = tc.target
			if got := targetInFlight(&spec); got != tc.want {
				t.Errorf("targetInFlight = %d, want %d", got, tc.want)
			}
		})
	}
}
