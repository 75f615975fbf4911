package noderouter

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/internal/routertest"
)

// TestSlimPodKeepsThePreconnectTarget: what the router's pod watch keeps
// of a pod is enough to pre-connect to it.
func TestSlimPodKeepsThePreconnectTarget(t *testing.T) {
	t.Parallel()
	const addr = "10.1.0.5:8080"
	// What the router's pod watch keeps of a pod is enough.
	slim, _ := slimPod(routertest.WarmPoolPod(t, "a", addr, func(p *corev1.Pod) {
		p.Labels["app"] = "echo"
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue})
	}))
	sp := slim.(*corev1.Pod)
	if got, ok := dataplane.PreconnectTo(sp); !ok || got != (dataplane.PreconnectTarget{Addr: addr}) {
		t.Errorf("PreconnectTo of the slim pod = %+v, %v", got, ok)
	}
	if len(sp.Labels) != 1 || len(sp.Status.Conditions) != 1 {
		t.Errorf("slimPod kept labels %v, conditions %v", sp.Labels, sp.Status.Conditions)
	}
	agent := func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "agent", Ports: []corev1.ContainerPort{{Name: v1alpha1.AssignPortName, ContainerPort: 7000}}}}
	}
	slim, _ = slimPod(routertest.WarmPoolPod(t, "a", addr, agent))
	if got, ok := dataplane.PreconnectTo(slim.(*corev1.Pod)); ok {
		t.Errorf("the slim pod of a pod with a native assign sidecar and no readiness probe gets pre-connection %+v", got)
	}
	slim, _ = slimPod(routertest.WarmPoolPod(t, "a", addr, agent, func(p *corev1.Pod) {
		p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: "/status/200", Port: intstr.FromString("http")}}}
	}))
	if got, ok := dataplane.PreconnectTo(slim.(*corev1.Pod)); !ok || got != (dataplane.PreconnectTarget{Addr: addr, ReadyPath: "/status/200"}) {
		t.Errorf("the slim pod of an agent pool's pod with an HTTP readiness probe: %+v, %v; want its probe's path", got, ok)
	}
}

func TestPreconnects(t *testing.T) {
	t.Parallel()
	daemon := DefaultConfig()
	for _, tc := range []struct {
		name    string
		mutate  func(*Config)
		want    bool
		warning bool
	}{
		{"a DaemonSet router", func(*Config) {}, true, false},
		{"off", func(c *Config) { c.PreconnectPoolPods = 0 }, false, false},
		{"a sidecar", func(c *Config) { c.Mode = ModeSidecar }, false, false},
		{"static controllers: no pod watch", func(c *Config) { c.ControllerAddresses = []string{"127.0.0.1:1"} }, false, false},
		{"net/http's forwarder", func(c *Config) { c.Forwarder = dataplane.ForwarderNethttp }, false, true},
		{"the h1 forwarder", func(c *Config) { c.Forwarder = dataplane.ForwarderH1 }, true, false},
		{"an idle timeout under two ticks", func(c *Config) { c.IdleConnTimeout = 9 * time.Second }, false, true},
		{"an idle timeout of two ticks", func(c *Config) { c.IdleConnTimeout = 10 * time.Second }, false, true},
		{"an idle timeout just over two ticks", func(c *Config) { c.IdleConnTimeout = 12 * time.Second }, true, false},
	} {
		cfg := daemon
		tc.mutate(&cfg)
		got, why := preconnects(cfg)
		if got != tc.want || (why != "") != tc.warning {
			t.Errorf("%s: preconnects = %v, %q", tc.name, got, why)
		}
	}
}

// podEvents records what the pod watch tells its podFeed.
type podEvents struct {
	mu     sync.Mutex
	events []string // "uid" or "uid deleted", in order
	list   func() []any
}

func (e *podEvents) Observe(p *corev1.Pod, deleted bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev := string(p.UID)
	if deleted {
		ev += " deleted"
	}
	e.events = append(e.events, ev)
}

func (e *podEvents) SetList(list func() []any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = list
}

// TestPreconnectFromTheWatch: the pod watch tells the pre-connections of
// every pod (after its slimming) and, once synced, hands them its cache
// (dataplane's TestPreconnectFillsFromTheList takes it from there).
func TestPreconnectFromTheWatch(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset(routertest.WarmPoolPod(t, "a", "10.1.0.1:8080"), routertest.WarmPoolPod(t, "b", "10.1.0.2:8080"))
	feed := &podEvents{}
	synced := make(chan struct{})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { done <- watchPods(ctx, cs, nil, feed, slog.New(slog.DiscardHandler), func() { close(synced) }) }()
	<-synced
	feed.mu.Lock()
	list := feed.list
	feed.mu.Unlock()
	if list == nil || len(list()) != 2 {
		t.Fatal("synced without handing over the watch's two pods")
	}
	// The handlers run after the cache is filled: wait for both pods'.
	poll.Until(t, pollTimeout, pollInterval, "both pods told", func(context.Context) error {
		feed.mu.Lock()
		defer feed.mu.Unlock()
		slices.Sort(feed.events)
		return poll.Unmet(slices.Equal(feed.events, []string{"a", "b"}), "events %v", feed.events)
	})
	if err := cs.CoreV1().Pods("default").Delete(ctx, "pod-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, pollInterval, "the deletion told", func(context.Context) error {
		feed.mu.Lock()
		defer feed.mu.Unlock()
		return poll.Unmet(slices.Contains(feed.events, "a deleted"), "events %v", feed.events)
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("watchPods: %v", err)
	}
}

// TestFirstCallUsesPreconnection: a warm pool pod the pod watch announces
// gets a connection opened with the GET of its assignment, and the first
// call of the function a claim then gives it goes out on that connection.
func TestFirstCallUsesPreconnection(t *testing.T) {
	t.Parallel()
	if testForwarder == dataplane.ForwarderNethttp {
		t.Skip("--forwarder nethttp keeps no pool of instance connections (no pre-connections: TestPreconnects)")
	}
	e := routertest.StartConnEcho(t, "uid-1")
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", e.Addr)))
	h := startRouter(t, fake, nil, func(rt *router) {
		rt.pre = dataplane.NewPreconnector(rt.proxy, 4, rt.log)
	})
	h.rt.pre.Observe(routertest.WarmPoolPod(t, "uid-1", e.Addr), false)
	poll.Until(t, pollTimeout, pollInterval, "the pre-connection pooled", func(context.Context) error {
		got := h.rt.proxy.IdleConns(e.Addr)
		return poll.Unmet(got == 1, "%d idle", got)
	})
	if r := h.call(t, "default/echo"); r.status != 200 {
		t.Fatalf("first call: %d %s", r.status, r.body)
	}
	reqs, conns := e.Requests()
	if len(reqs) != 2 || conns != 1 {
		t.Fatalf("the instance saw %v on %d connections, want the GET and the call on one", reqs, conns)
	}
	if want := assign.Path + " "; reqs[0][:len(want)] != want {
		t.Errorf("first request %q, want the GET of the assignment", reqs[0])
	}
	if got := routertest.Value(t, h.rt.m.reg, "skipper_noderouter_preconnects_total", "result", "ok"); got != 1 {
		t.Errorf("preconnects ok = %v, want 1", got)
	}
}
