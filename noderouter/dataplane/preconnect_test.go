package dataplane

import (
	"errors"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/noderouter/internal/routertest"
)

func TestPreconnectTo(t *testing.T) {
	t.Parallel()
	const addr = "10.1.0.5:8080"
	agent := func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "agent", Ports: []corev1.ContainerPort{{Name: v1alpha1.AssignPortName, ContainerPort: 7000}}}}
	}
	ready := func(g corev1.HTTPGetAction) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			agent(p)
			p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &g}}
		}
	}
	for _, tc := range []struct {
		name string
		opt  func(*corev1.Pod)
		want PreconnectTarget // zero: none
	}{
		{"warm pool pod", func(*corev1.Pod) {}, PreconnectTarget{Addr: addr}},
		{"claimed", func(p *corev1.Pod) { p.Labels[v1alpha1.LabelFunction] = "hello" }, PreconnectTarget{}},
		{"claimed with an empty name", func(p *corev1.Pod) { p.Labels[v1alpha1.LabelFunction] = "" }, PreconnectTarget{}},
		{"not a pool's", func(p *corev1.Pod) { delete(p.Labels, v1alpha1.LabelPool) }, PreconnectTarget{}},
		{"not ready", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }, PreconnectTarget{}},
		{"no readiness yet", func(p *corev1.Pod) { p.Status.Conditions = nil }, PreconnectTarget{}},
		{"terminating", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }, PreconnectTarget{}},
		{"no IP", func(p *corev1.Pod) { p.Status.PodIP = "" }, PreconnectTarget{}},
		{"no port", func(p *corev1.Pod) { p.Spec.Containers[0].Ports = nil }, PreconnectTarget{}},
		{"the first container's first port", func(p *corev1.Pod) {
			p.Spec.Containers = []corev1.Container{
				{Name: "main", Ports: []corev1.ContainerPort{{ContainerPort: 0}, {ContainerPort: 9000}, {ContainerPort: 9001}}},
				{Name: "side", Ports: []corev1.ContainerPort{{ContainerPort: 7000}}},
			}
		}, PreconnectTarget{Addr: "10.1.0.5:9000"}},
		{"a sidecar serves the assign endpoint, no readiness probe", func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "agent", Ports: []corev1.ContainerPort{{Name: v1alpha1.AssignPortName, ContainerPort: 7000}}})
		}, PreconnectTarget{}},
		{"a native sidecar serves the assign endpoint, no readiness probe", agent, PreconnectTarget{}},
		{"the agent and a readiness probe on the port's number", ready(corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}),
			PreconnectTarget{Addr: addr, ReadyPath: "/healthz"}},
		{"the agent and a readiness probe on the port's name, no path", ready(corev1.HTTPGetAction{Port: intstr.FromString("http"), Scheme: corev1.URISchemeHTTP}),
			PreconnectTarget{Addr: addr, ReadyPath: "/"}},
		{"the probe on another port", ready(corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(9090)}), PreconnectTarget{}},
		{"the probe over HTTPS", ready(corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080), Scheme: corev1.URISchemeHTTPS}), PreconnectTarget{}},
		{"the probe with headers", ready(corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080),
			HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Token", Value: "t"}}}), PreconnectTarget{}},
		{"the probe to another host", ready(corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080), Host: "example.com"}), PreconnectTarget{}},
		{"a path that would split the request line", ready(corev1.HTTPGetAction{Path: "/a b", Port: intstr.FromInt32(8080)}), PreconnectTarget{}},
		{"an exec probe", func(p *corev1.Pod) {
			agent(p)
			p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
		}, PreconnectTarget{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := PreconnectTo(routertest.WarmPoolPod(t, "a", addr, tc.opt))
			if got != tc.want || ok != (tc.want != PreconnectTarget{}) {
				t.Errorf("PreconnectTo = %+v, %v; want %+v", got, ok, tc.want)
			}
		})
	}
}

// TestPreconnectToTheApplication: a pod whose agent serves the assign
// endpoint is pre-connected with its application's readiness GET, and the
// connection pooled; an answer the kubelet would count as not ready
// pools nothing.
func TestPreconnectToTheApplication(t *testing.T) {
	t.Parallel()
	var paths []string
	var mu sync.Mutex
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(app.Close)
	addr := app.Listener.Addr().String()
	pool := newUpstreamPool(&net.Dialer{Timeout: time.Second}, 4, time.Minute)
	t.Cleanup(pool.close)
	pc := newPreconnector(pool, 4, time.Minute, NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	if err := pc.open(t.Context(), "uid-1", addr, "/healthz"); err != nil || pool.idleCount(addr) != 1 {
		t.Fatalf("readiness GET: %v, %d pooled; want one pooled", err, pool.idleCount(addr))
	}
	if err := pc.open(t.Context(), "uid-1", addr, "/missing"); err == nil || pool.idleCount(addr) != 0 {
		t.Errorf("a 404 to the readiness GET: %v, %d pooled; want an error and none pooled", err, pool.idleCount(addr))
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(paths, []string{"/healthz", "/missing"}) {
		t.Errorf("the application was asked %v; want its readiness path, then /missing (never the assign endpoint)", paths)
	}
}

// TestPreconnectFillsFromTheList: pods become targets within the bound; a
// claimed one leaves room that the next fill takes from the pod watch's
// list (no event announces the pod turned away).
func TestPreconnectFillsFromTheList(t *testing.T) {
	t.Parallel()
	a, b := routertest.WarmPoolPod(t, "a", "10.1.0.1:8080"), routertest.WarmPoolPod(t, "b", "10.1.0.2:8080")
	pc := newPreconnector(nil, 1, time.Minute, NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	pc.Observe(a, false)
	pc.Observe(b, false)
	watched := []any{a, b} // the pod watch's cache
	pc.SetList(func() []any { return watched })
	targets := func() []string {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		return slices.Sorted(maps.Keys(pc.targets))
	}
	if got := targets(); !slices.Equal(got, []string{"a"}) || !pc.missed {
		t.Fatalf("targets %v, missed %v; want [a] (bound 1) and b turned away", got, pc.missed)
	}
	claimed := routertest.WarmPoolPod(t, "a", "10.1.0.1:8080", func(p *corev1.Pod) { p.Labels[v1alpha1.LabelFunction] = "hello" })
	watched[0] = claimed
	pc.Observe(claimed, false)
	if got := targets(); len(got) != 0 {
		t.Fatalf("after the claim: targets %v, want none", got)
	}
	pc.fill()
	if got := targets(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("after a fill: targets %v, want [b]", got)
	}
}

// TestPreconnectRenewsOnItsConnection: a renewal sends the GET on the
// connection the pool holds, not a new one.
func TestPreconnectRenewsOnItsConnection(t *testing.T) {
	t.Parallel()
	e := routertest.StartConnEcho(t, "uid-1")
	pool := newUpstreamPool(&net.Dialer{Timeout: time.Second}, 4, time.Minute)
	t.Cleanup(pool.close)
	pc := newPreconnector(pool, 4, time.Minute, NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	for range 2 {
		if err := pc.open(t.Context(), "uid-1", e.Addr, ""); err != nil {
			t.Fatal(err)
		}
	}
	reqs, conns := e.Requests()
	if len(reqs) != 2 || conns != 1 || pool.idleCount(e.Addr) != 1 {
		t.Errorf("two GETs: %v on %d connections, %d pooled; want 2 on 1, 1 pooled", reqs, conns, pool.idleCount(e.Addr))
	}
	// An instance that answers otherwise leaves nothing pooled.
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
	}))
	t.Cleanup(bad.Close)
	badAddr := bad.Listener.Addr().String()
	if err := pc.open(t.Context(), "uid-2", badAddr, ""); err == nil || pool.idleCount(badAddr) != 0 {
		t.Errorf("an instance closing after the GET: err %v, %d pooled", err, pool.idleCount(badAddr))
	}
	gone := routertest.DeadAddress(t)
	if err := pc.open(t.Context(), "uid-3", gone, ""); err == nil {
		t.Error("no error from an address that refuses")
	}
	// Asked as another pod (the address was reused): said, and the
	// connection it went on is closed, not pooled.
	if err := pc.open(t.Context(), "uid-other", e.Addr, ""); !errors.Is(err, errOtherPod) {
		t.Errorf("GET as another pod: %v, want errOtherPod", err)
	}
	if n := pool.idleCount(e.Addr); n != 0 {
		t.Errorf("%d pooled after the other pod's GET, want 0", n)
	}
}

// TestPreconnectTargets: the targets follow the pod events, within the
// bound; due ones are those never opened or opened a renewal ago.
func TestPreconnectTargets(t *testing.T) {
	t.Parallel()
	pc := newPreconnector(nil, 2, time.Minute, NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	// Before run no connection is opened: observe only records.
	pc.Observe(routertest.WarmPoolPod(t, "a", "10.1.0.1:8080"), false)
	pc.Observe(routertest.WarmPoolPod(t, "b", "10.1.0.2:8080"), false)
	pc.Observe(routertest.WarmPoolPod(t, "c", "10.1.0.3:8080"), false)
	if len(pc.targets) != 2 || pc.targets["c"] != nil {
		t.Fatalf("targets %v, want a and b (bound 2)", pc.targets)
	}
	pc.Observe(routertest.WarmPoolPod(t, "a", "10.1.0.1:8080", func(p *corev1.Pod) { p.Labels[v1alpha1.LabelFunction] = "hello" }), false)
	pc.Observe(routertest.WarmPoolPod(t, "c", "10.1.0.3:8080"), false)
	if pc.targets["a"] != nil || pc.targets["c"] == nil {
		t.Fatalf("targets %v: a claimed (dropped), c in its place", pc.targets)
	}
	pc.Observe(routertest.WarmPoolPod(t, "b", "10.1.0.2:8080"), true)
	if pc.targets["b"] != nil {
		t.Error("a deleted pod is still a target")
	}
	now := time.Now()
	pc.targets["c"].at = now.Add(-30 * time.Second)
	pc.targets["d"] = &preconnTarget{addr: "10.1.0.4:8080", at: now.Add(-time.Minute)}
	pc.targets["e"] = &preconnTarget{addr: "10.1.0.5:8080", busy: true}
	pc.targets["f"] = &preconnTarget{addr: "10.1.0.6:8080"}
	due := pc.dueLocked(now)
	if len(due) != 2 || due["d"] == nil || due["f"] == nil {
		t.Errorf("due %v, want d (a renewal old) and f (never opened)", due)
	}
	// A pod whose address changed is due again.
	pc.Observe(routertest.WarmPoolPod(t, "c", "10.1.0.9:8080"), false)
	if tg := pc.targets["c"]; tg.addr != "10.1.0.9:8080" || !tg.at.IsZero() {
		t.Errorf("target c = %+v after its address changed", tg)
	}
	// A pod whose address answered as another pod stays out until it
	// changes.
	pc = newPreconnector(nil, 4, time.Minute, NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	pc.skip["g"] = "7"
	at := func(rv string) *corev1.Pod {
		return routertest.WarmPoolPod(t, "g", "10.1.0.7:8080", func(p *corev1.Pod) { p.ResourceVersion = rv })
	}
	pc.Observe(at("7"), false)
	if pc.targets["g"] != nil {
		t.Error("a skipped pod unchanged became a target")
	}
	pc.Observe(at("8"), false)
	if pc.targets["g"] == nil || len(pc.skip) != 0 {
		t.Errorf("a skipped pod that changed: target %v, skip %v", pc.targets["g"], pc.skip)
	}
}

func TestPreconnectRenewal(t *testing.T) {
	t.Parallel()
	if got := preconnectRenewal(90 * time.Second); got != 45*time.Second {
		t.Errorf("renewal for a 90s idle timeout = %s", got)
	}
	if got := preconnectRenewal(10 * time.Minute); got != 50*time.Second {
		t.Errorf("renewal for a 10m idle timeout = %s, want 50s (the echo runtime's 2m)", got)
	}
}
