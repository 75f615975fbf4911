package noderouter

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"skipper.dev/skipper/cmd/skipper-echo/echo"
	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/internal/poll"
)

// warmPoolPod is a ready, unclaimed pool pod at addr (host:port).
func warmPoolPod(t *testing.T, uid, addr string, opts ...func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-" + uid, Namespace: "default", UID: types.UID(uid),
			Labels: map[string]string{v1alpha1.LabelPool: "echo"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "echo", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(n)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: host,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func TestPreconnectAddr(t *testing.T) {
	t.Parallel()
	const addr = "10.1.0.5:8080"
	for _, tc := range []struct {
		name string
		opt  func(*corev1.Pod)
		want string
	}{
		{"warm pool pod", func(*corev1.Pod) {}, addr},
		{"claimed", func(p *corev1.Pod) { p.Labels[v1alpha1.LabelFunction] = "hello" }, ""},
		{"claimed with an empty name", func(p *corev1.Pod) { p.Labels[v1alpha1.LabelFunction] = "" }, ""},
		{"not a pool's", func(p *corev1.Pod) { delete(p.Labels, v1alpha1.LabelPool) }, ""},
		{"not ready", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }, ""},
		{"no readiness yet", func(p *corev1.Pod) { p.Status.Conditions = nil }, ""},
		{"terminating", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }, ""},
		{"no IP", func(p *corev1.Pod) { p.Status.PodIP = "" }, ""},
		{"no port", func(p *corev1.Pod) { p.Spec.Containers[0].Ports = nil }, ""},
		{"the first container's first port", func(p *corev1.Pod) {
			p.Spec.Containers = []corev1.Container{
				{Name: "main", Ports: []corev1.ContainerPort{{ContainerPort: 0}, {ContainerPort: 9000}, {ContainerPort: 9001}}},
				{Name: "side", Ports: []corev1.ContainerPort{{ContainerPort: 7000}}},
			}
		}, "10.1.0.5:9000"},
		{"a sidecar serves the assign endpoint", func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "agent", Ports: []corev1.ContainerPort{{Name: v1alpha1.AssignPortName, ContainerPort: 7000}}})
		}, ""},
		{"a native sidecar serves the assign endpoint", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "agent", Ports: []corev1.ContainerPort{{Name: v1alpha1.AssignPortName, ContainerPort: 7000}}}}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := preconnectAddr(warmPoolPod(t, "a", addr, tc.opt))
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("preconnectAddr = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
	// What the router's pod watch keeps of a pod is enough.
	slim, _ := slimPod(warmPoolPod(t, "a", addr, func(p *corev1.Pod) {
		p.Labels["app"] = "echo"
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue})
	}))
	sp := slim.(*corev1.Pod)
	if got, ok := preconnectAddr(sp); !ok || got != addr {
		t.Errorf("preconnectAddr of the slim pod = %q, %v", got, ok)
	}
	if len(sp.Labels) != 1 || len(sp.Status.Conditions) != 1 {
		t.Errorf("slimPod kept labels %v, conditions %v", sp.Labels, sp.Status.Conditions)
	}
	slim, _ = slimPod(warmPoolPod(t, "a", addr, func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "agent", Ports: []corev1.ContainerPort{{Name: v1alpha1.AssignPortName, ContainerPort: 7000}}}}
	}))
	if got, ok := preconnectAddr(slim.(*corev1.Pod)); ok {
		t.Errorf("the slim pod of a pod with a native assign sidecar gets pre-connection %q", got)
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
		{"net/http's forwarder", func(c *Config) { c.Forwarder = forwarderNethttp }, false, true},
		{"the h1 forwarder", func(c *Config) { c.Forwarder = forwarderH1 }, true, false},
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

// TestPreconnectFromTheWatch: the pod watch's pods become targets, within
// the bound; a claimed one leaves room that the next fill takes from the
// watch's cache (no event announces the pod turned away).
func TestPreconnectFromTheWatch(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset(warmPoolPod(t, "a", "10.1.0.1:8080"), warmPoolPod(t, "b", "10.1.0.2:8080"))
	pc := newPreconnector(nil, 1, time.Minute, newMetrics("node1"), slog.New(slog.DiscardHandler))
	synced := make(chan struct{})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { done <- watchPods(ctx, cs, nil, pc, slog.New(slog.DiscardHandler), func() { close(synced) }) }()
	<-synced
	targets := func() []string {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		return slices.Sorted(maps.Keys(pc.targets))
	}
	// The handlers run after the cache is filled: wait for both pods'.
	poll.Until(t, pollTimeout, pollInterval, "one target (bound 1) and one turned away", func(context.Context) error {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		return unmet(len(pc.targets) == 1 && pc.missed, "%d targets, missed %v", len(pc.targets), pc.missed)
	})
	first := targets()
	other := map[string]string{"a": "b", "b": "a"}[first[0]]
	claimed := warmPoolPod(t, first[0], "10.1.0.1:8080", func(p *corev1.Pod) { p.Labels[v1alpha1.LabelFunction] = "hello" })
	if _, err := cs.CoreV1().Pods("default").Update(ctx, claimed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, pollInterval, "the claimed pod dropped", func(context.Context) error { return unmet(len(targets()) == 0, "%d targets", len(targets())) })
	pc.fill()
	if got := targets(); len(got) != 1 || got[0] != other {
		t.Errorf("after a fill: targets %v, want [%s]", got, other)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("watchPods: %v", err)
	}
}

// connEcho is the real echo handler as pod uid, recording which
// connection (the caller's address) each request came on.
type connEcho struct {
	addr string
	mu   sync.Mutex
	reqs []string // "path from"
	conn map[string]int
}

func startConnEcho(t *testing.T, uid string) *connEcho {
	t.Helper()
	cfg := echo.DefaultConfig()
	cfg.PodUID, cfg.PodName = uid, "pod-"+uid
	h := echo.NewServer(cfg, slog.New(slog.DiscardHandler))
	e := &connEcho{conn: map[string]int{}}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.reqs = append(e.reqs, r.URL.Path+" "+r.RemoteAddr)
		e.conn[r.RemoteAddr]++
		e.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	e.addr = ts.Listener.Addr().String()
	return e
}

func (e *connEcho) requests() ([]string, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.reqs...), len(e.conn)
}

// TestFirstCallUsesPreconnection: a warm pool pod the pod watch announces
// gets a connection opened with the GET of its assignment, and the first
// call of the function a claim then gives it goes out on that connection.
func TestFirstCallUsesPreconnection(t *testing.T) {
	t.Parallel()
	if testForwarder == forwarderNethttp {
		t.Skip("--forwarder nethttp keeps no pool of instance connections (no pre-connections: TestPreconnects)")
	}
	e := startConnEcho(t, "uid-1")
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", e.addr)))
	h := startRouter(t, fake, nil, func(rt *router) {
		rt.pre = newPreconnector(rt.proxy.pool, 4, time.Minute, rt.m, rt.log)
	})
	h.rt.pre.observe(warmPoolPod(t, "uid-1", e.addr), false)
	poll.Until(t, pollTimeout, pollInterval, "the pre-connection pooled", func(context.Context) error {
		got := h.rt.proxy.pool.idleCount(e.addr)
		return unmet(got == 1, "%d idle", got)
	})
	if r := h.call(t, "default/echo"); r.status != 200 {
		t.Fatalf("first call: %d %s", r.status, r.body)
	}
	reqs, conns := e.requests()
	if len(reqs) != 2 || conns != 1 {
		t.Fatalf("the instance saw %v on %d connections, want the GET and the call on one", reqs, conns)
	}
	if want := assign.Path + " "; reqs[0][:len(want)] != want {
		t.Errorf("first request %q, want the GET of the assignment", reqs[0])
	}
	if got := counter(h.rt.m.preconnects.WithLabelValues("ok")); got != 1 {
		t.Errorf("preconnects ok = %v, want 1", got)
	}
}

// TestPreconnectRenewsOnItsConnection: a renewal sends the GET on the
// connection the pool holds, not a new one.
func TestPreconnectRenewsOnItsConnection(t *testing.T) {
	t.Parallel()
	e := startConnEcho(t, "uid-1")
	pool := newUpstreamPool(&net.Dialer{Timeout: time.Second}, 4, time.Minute)
	t.Cleanup(pool.close)
	pc := newPreconnector(pool, 4, time.Minute, newMetrics("node1"), slog.New(slog.DiscardHandler))
	for range 2 {
		if err := pc.open(t.Context(), "uid-1", e.addr); err != nil {
			t.Fatal(err)
		}
	}
	reqs, conns := e.requests()
	if len(reqs) != 2 || conns != 1 || pool.idleCount(e.addr) != 1 {
		t.Errorf("two GETs: %v on %d connections, %d pooled; want 2 on 1, 1 pooled", reqs, conns, pool.idleCount(e.addr))
	}
	// An instance that answers otherwise leaves nothing pooled.
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
	}))
	t.Cleanup(bad.Close)
	badAddr := bad.Listener.Addr().String()
	if err := pc.open(t.Context(), "uid-2", badAddr); err == nil || pool.idleCount(badAddr) != 0 {
		t.Errorf("an instance closing after the GET: err %v, %d pooled", err, pool.idleCount(badAddr))
	}
	gone := deadAddress(t)
	if err := pc.open(t.Context(), "uid-3", gone); err == nil {
		t.Error("no error from an address that refuses")
	}
	// Asked as another pod (the address was reused): said, and the
	// connection it went on is closed, not pooled.
	if err := pc.open(t.Context(), "uid-other", e.addr); !errors.Is(err, errOtherPod) {
		t.Errorf("GET as another pod: %v, want errOtherPod", err)
	}
	if n := pool.idleCount(e.addr); n != 0 {
		t.Errorf("%d pooled after the other pod's GET, want 0", n)
	}
}

// TestPreconnectTargets: the targets follow the pod events, within the
// bound; due ones are those never opened or opened a renewal ago.
func TestPreconnectTargets(t *testing.T) {
	t.Parallel()
	pc := newPreconnector(nil, 2, time.Minute, newMetrics("node1"), slog.New(slog.DiscardHandler))
	// Before run no connection is opened: observe only records.
	pc.observe(warmPoolPod(t, "a", "10.1.0.1:8080"), false)
	pc.observe(warmPoolPod(t, "b", "10.1.0.2:8080"), false)
	pc.observe(warmPoolPod(t, "c", "10.1.0.3:8080"), false)
	if len(pc.targets) != 2 || pc.targets["c"] != nil {
		t.Fatalf("targets %v, want a and b (bound 2)", pc.targets)
	}
	pc.observe(warmPoolPod(t, "a", "10.1.0.1:8080", func(p *corev1.Pod) { p.Labels[v1alpha1.LabelFunction] = "hello" }), false)
	pc.observe(warmPoolPod(t, "c", "10.1.0.3:8080"), false)
	if pc.targets["a"] != nil || pc.targets["c"] == nil {
		t.Fatalf("targets %v: a claimed (dropped), c in its place", pc.targets)
	}
	pc.observe(warmPoolPod(t, "b", "10.1.0.2:8080"), true)
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
	pc.observe(warmPoolPod(t, "c", "10.1.0.9:8080"), false)
	if tg := pc.targets["c"]; tg.addr != "10.1.0.9:8080" || !tg.at.IsZero() {
		t.Errorf("target c = %+v after its address changed", tg)
	}
	// A pod whose address answered as another pod stays out until it
	// changes.
	pc = newPreconnector(nil, 4, time.Minute, newMetrics("node1"), slog.New(slog.DiscardHandler))
	pc.skip["g"] = "7"
	at := func(rv string) *corev1.Pod {
		return warmPoolPod(t, "g", "10.1.0.7:8080", func(p *corev1.Pod) { p.ResourceVersion = rv })
	}
	pc.observe(at("7"), false)
	if pc.targets["g"] != nil {
		t.Error("a skipped pod unchanged became a target")
	}
	pc.observe(at("8"), false)
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
