package controller

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

func withPort(port int32) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers = []corev1.Container{{Name: "main", Ports: []corev1.ContainerPort{{ContainerPort: port}}}}
	}
}

func TestPreconnectable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want int32
	}{
		{"ready pool pod", poolPod("a", "echo", withPort(8080)), 8080},
		{"the first container's first port", poolPod("a", "echo", func(p *corev1.Pod) {
			p.Spec.Containers = []corev1.Container{
				{Name: "main", Ports: []corev1.ContainerPort{{ContainerPort: 0}, {ContainerPort: 9000}}},
				{Name: "side", Ports: []corev1.ContainerPort{{ContainerPort: 7000}}},
			}
		}), 9000},
		{"claimed", poolPod("a", "echo", withPort(8080), labelled(v1alpha1.LabelFunction, "hello")), 0},
		{"not ready", poolPod("a", "echo", withPort(8080), notReady), 0},
		{"terminating", poolPod("a", "echo", withPort(8080), terminating), 0},
		{"no IP", poolPod("a", "echo", withPort(8080), ip("")), 0},
		{"no port", poolPod("a", "echo"), 0},
		{"not a pool's", testPod("a", withPort(8080), func(p *corev1.Pod) { delete(p.Labels, v1alpha1.LabelPool) }), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := v1alpha1.WarmPoolPodPort(tc.pod)
			if got != tc.want || ok != (tc.want != 0) {
				t.Errorf("WarmPoolPodPort = %d, %v; want %d", got, ok, tc.want)
			}
		})
	}
}

func TestPreconnectsDue(t *testing.T) {
	t.Parallel()
	pc := newPreconnects()
	const uid = "uid-a"
	if !pc.due(uid, t0, 2) {
		t.Fatal("a pod never connected to is not due")
	}
	if pc.due(uid, t0.Add(preconnectRenew-time.Second), 2) {
		t.Error("due again before preconnectRenew")
	}
	if !pc.due(uid, t0.Add(preconnectRenew), 2) {
		t.Error("not due after preconnectRenew")
	}
	pc.later(uid)
	if !pc.due(uid, t0.Add(preconnectRenew+time.Second), 2) {
		t.Error("a failed connection is not due at once")
	}
	pc.later("uid-never")
	pc.keepOnly(map[types.UID]bool{"uid-b": true})
	if len(pc.at) != 0 {
		t.Errorf("keepOnly kept %v", pc.at)
	}
	pc.due(uid, t0, 2)
	pc.forget(uid)
	if len(pc.at) != 0 {
		t.Error("forget kept the pod")
	}
	// The bound refuses new pods, never the renewal of one held.
	pc.due("uid-1", t0, 2)
	pc.due("uid-2", t0, 2)
	if pc.due("uid-3", t0, 2) {
		t.Error("a third pod is due with two held and a bound of 2")
	}
	if !pc.due("uid-1", t0.Add(preconnectRenew), 2) {
		t.Error("a held pod is not renewed at the bound")
	}
	pc.forget("uid-2")
	if !pc.due("uid-3", t0, 2) {
		t.Error("a pod is refused below the bound")
	}
}

func TestMineFirst(t *testing.T) {
	t.Parallel()
	pods := []*corev1.Pod{poolPod("a", "echo"), poolPod("b", "echo"), poolPod("c", "echo"), poolPod("d", "echo")}
	mine := func(uid string) bool { return uid == "uid-b" || uid == "uid-d" }
	var got []string
	for _, p := range mineFirst(pods, mine) {
		got = append(got, p.Name)
	}
	if strings.Join(got, ",") != "b,d,a,c" {
		t.Errorf("mineFirst = %v, want b,d,a,c", got)
	}
}

// preconnectedReplica starts a replica over e with Function hello and one
// Ready pool pod p1 whose container declares the test instance's port, and
// returns once the replica has pre-connected to p1; requests lists the
// instance's requests so far.
func preconnectedReplica(t *testing.T, e *testEnv) (r *replica, requests func() []string) {
	t.Helper()
	fn := e.fnFor("hello", "echo")
	fn.Spec.MinInstances = 0
	e.add(poolDeploy("echo"), fn, poolPod("p1", "echo", withPort(e.assignPort)))
	r = startReplica(t, e, "ctl-0", nil, nil)
	requests = func() []string {
		e.mu.Lock()
		defer e.mu.Unlock()
		return append([]string(nil), e.requests...)
	}
	poll.Until(t, 10*time.Second, pollInterval, "a pre-connection to the ready pool pod", func(context.Context) error {
		if len(requests()) == 0 {
			return errors.New("no request yet")
		}
		return nil
	})
	return r, requests
}

// from is the client address of a request as testEnv.requests lists it.
func from(req string) string { return req[strings.Index(req, " ")+1:] }

// TestAssignUsesPreconnectedConnection: a replica opens a connection to a
// ready pool pod the ring gives it before any claim, and the claim's
// assign is written on it: the instance accepts no second connection.
func TestAssignUsesPreconnectedConnection(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	r, reqs := preconnectedReplica(t, e)
	if _, err := getInstance(t.Context(), r, "hello", nil); err != nil {
		t.Fatal(err)
	}
	got := reqs()
	if len(got) != 2 || !strings.HasPrefix(got[0], "GET ") || !strings.HasPrefix(got[1], "POST ") {
		t.Fatalf("requests to the instance = %q, want the pre-connection's GET, then the assign", got)
	}
	if from(got[0]) != from(got[1]) {
		t.Errorf("the assign came on a new connection (%s), not the one opened before (%s)", from(got[1]), from(got[0]))
	}
}

// TestAssignSignedInTheInstancesFormat: the assign's token is in the
// format the instance's GET answer asked for; an instance that names none
// (older than the list) gets FormatV1, which every instance verifies.
func TestAssignSignedInTheInstancesFormat(t *testing.T) {
	t.Parallel()
	for listed, wantPrefix := range map[string]string{
		"":          "v1.",
		"jws, v1":   "eyJ", // base64url of `{"`: a compact JWS
		"v1, jws":   "v1.",
		"paseto-v4": "v1.",
	} {
		t.Run(listed, func(t *testing.T) {
			t.Parallel()
			e := newTestEnv(t)
			e.formats = listed
			r, _ := preconnectedReplica(t, e)
			if _, err := getInstance(t.Context(), r, "hello", nil); err != nil {
				t.Fatal(err)
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			if len(e.assigned) != 1 || !strings.HasPrefix(e.assigned[0].Token, wantPrefix) {
				t.Fatalf("assigns %+v; want one with a token starting %q", e.assigned, wantPrefix)
			}
		})
	}
}

// TestAssignRepeatedAfterKeptAliveConnectionFails: the instance takes
// the assign on the pre-opened connection and closes it without an
// answer. The claim sends the assign once more on a new connection, with
// a token of its own, and the repeat for the function held is a 200: the
// claim succeeds and the pod is kept.
func TestAssignRepeatedAfterKeptAliveConnectionFails(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	e.mu.Lock()
	e.dropAssigns = 1
	e.mu.Unlock()
	r, reqs := preconnectedReplica(t, e)
	resp, err := getInstance(t.Context(), r, "hello", nil)
	if err != nil {
		t.Fatalf("GetInstance after the kept-alive connection failed: %v", err)
	}
	if len(resp.GetInstances()) != 1 || resp.GetInstances()[0].GetPodUid() != "uid-p1" {
		t.Errorf("instances = %v, want p1", resp.GetInstances())
	}
	got := reqs()
	if len(got) != 3 || from(got[1]) != from(got[0]) || from(got[2]) == from(got[1]) {
		t.Fatalf("requests = %q, want the GET, the assign on its connection, the repeat on a new one", got)
	}
	as := e.assignRequests()
	if len(as) != 2 || as[0].Token == as[1].Token || as[0].Claim != as[1].Claim {
		t.Errorf("assigns = %d; want two with tokens of their own and one claim id", len(as))
	}
	if p := e.pod("p1"); p == nil || p.DeletionTimestamp != nil {
		t.Error("the pool pod was deleted")
	}
}
