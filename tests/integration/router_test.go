package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/cmd/skipper-echo/echo"
	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/cgroup"
)

const namespace = "default" // the example pool echo lives here

// getInstances is the router's GetInstance count, every result.
const getInstances = "skipper_noderouter_get_instance_total"

// createFunction creates a Function on pool echo with spec merged in,
// deletes it when the test ends, and waits until its owner has taken it
// (status.owner), so that the first request finds it.
func createFunction(t *testing.T, prefix string, spec map[string]any) string {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	name := prefix + "-" + hex.EncodeToString(b[:])
	full := map[string]any{"pool": "echo"}
	for k, v := range spec {
		full[k] = v
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(),
		"kind":       "Function",
		"metadata":   map[string]any{"name": name, "namespace": namespace},
		"spec":       full,
	}}
	fns := env.dyn.Resource(v1alpha1.Resource).Namespace(namespace)
	if _, err := fns.Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Function %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := fns.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Function %s: %v", name, err)
		}
	})
	poll.Until(t, 30*time.Second, pollInterval, "Function "+name+" taken by its owner", func(ctx context.Context) error {
		fn, err := fns.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if owner, _, _ := unstructured.NestedString(fn.Object, "status", "owner"); owner == "" {
			return fmt.Errorf("status.owner is empty")
		}
		return nil
	})
	return name
}

// call sends one request for fn through the in-process router and returns
// its status and the pod UID of the instance that answered.
func call(ctx context.Context, fn, path string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", env.routerURL+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("X-Skipper-Function", namespace+"/"+fn)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", err
	}
	if resp.StatusCode != 200 {
		return resp.StatusCode, "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var e echo.Response
	if err := json.Unmarshal(b, &e); err != nil {
		return resp.StatusCode, "", fmt.Errorf("decode %q: %w", b, err)
	}
	return resp.StatusCode, e.Pod.UID, nil
}

// pollInterval is how often the tests' poll.Until calls a condition.
const pollInterval = 100 * time.Millisecond

func TestWarmRequestsMakeNoGetInstance(t *testing.T) {
	fn := createFunction(t, "warm", map[string]any{"maxInstances": int64(1)})
	var first string
	poll.Until(t, 30*time.Second, pollInterval, "the cold call", func(ctx context.Context) (err error) {
		_, first, err = call(ctx, fn, "/")
		return err
	})
	before := metric(t, getInstances, nil)
	for i := range 50 {
		_, uid, err := call(t.Context(), fn, "/")
		if err != nil {
			t.Fatalf("warm call %d: %v", i, err)
		}
		if uid != first {
			t.Errorf("warm call %d answered by %s, the cold one by %s (maxInstances 1)", i, uid, first)
		}
	}
	if after := metric(t, getInstances, nil); after != before {
		t.Errorf("%s went from %v to %v over 50 warm requests; want no change", getInstances, before, after)
	}
}

func TestConcurrentColdMissesMakeOneGetInstance(t *testing.T) {
	fn := createFunction(t, "cold", map[string]any{"maxInstances": int64(1)})
	before := metric(t, getInstances, nil)
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			if _, _, err := call(t.Context(), fn, "/"); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("cold call: %v", err)
	}
	if d := metric(t, getInstances, nil) - before; d != 1 {
		t.Errorf("%d concurrent first requests made %v GetInstance calls; want 1", n, d)
	}
}

// waitBothInstances calls fn until both of its two instances have answered.
func waitBothInstances(t *testing.T, fn string) {
	t.Helper()
	seen := map[string]bool{}
	poll.Until(t, 60*time.Second, pollInterval, "both instances answering", func(ctx context.Context) error {
		_, uid, err := call(ctx, fn, "/")
		if err != nil {
			return err
		}
		seen[uid] = true
		if len(seen) < 2 {
			return fmt.Errorf("answered by %d instance(s)", len(seen))
		}
		return nil
	})
}

// TestWithdrawalStopsTraffic scales a function from two instances to one
// under steady load: the controller withdraws one instance (a pushed
// update), waits for the router's ack and deletes it. No request may reach
// the instance once its deletion started, none may fail, and the router
// must never meet a dead instance (no eviction, no retry).
func TestWithdrawalStopsTraffic(t *testing.T) {
	fn := createFunction(t, "withdraw", map[string]any{"minInstances": int64(2), "maxInstances": int64(2)})
	waitBothInstances(t, fn)
	pods, err := env.kube.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + fn})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{} // uid → pod name
	for _, p := range pods.Items {
		names[string(p.UID)] = p.Name
	}
	evictions := metric(t, "skipper_noderouter_evictions_total", nil)
	retries := metric(t, "skipper_noderouter_retries_total", nil)

	type answer struct {
		start time.Time
		uid   string
		err   error
	}
	var mu sync.Mutex
	var answers []answer
	ctx, stop := context.WithCancel(t.Context())
	var load sync.WaitGroup
	load.Go(func() {
		for ctx.Err() == nil {
			start := time.Now()
			_, uid, err := call(ctx, fn, "/")
			if ctx.Err() != nil {
				return
			}
			mu.Lock()
			answers = append(answers, answer{start, uid, err})
			mu.Unlock()
		}
	})
	defer func() {
		stop()
		load.Wait()
	}()

	patch := []byte(`{"spec":{"minInstances":1,"maxInstances":1}}`)
	if _, err := env.dyn.Resource(v1alpha1.Resource).Namespace(namespace).Patch(t.Context(), fn, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("scale down: %v", err)
	}
	// The victim is the instance whose pod starts terminating first.
	var victim string
	var deleting time.Time
	poll.Until(t, 90*time.Second, pollInterval, "one instance deleted", func(ctx context.Context) error {
		for uid, name := range names {
			p, err := env.kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && (p.DeletionTimestamp != nil || string(p.UID) != uid)) {
				if victim == "" {
					victim, deleting = uid, time.Now()
				}
			}
			if uid == victim && apierrors.IsNotFound(err) {
				return nil
			}
		}
		return fmt.Errorf("victim %q not gone yet", victim)
	})
	time.Sleep(time.Second) // sleep: load (more after the deletion: the check is on what it answered)
	stop()
	load.Wait()

	mu.Lock()
	defer mu.Unlock()
	var late, failed int
	for _, a := range answers {
		if a.err != nil {
			failed++
			t.Logf("request at %s: %v", a.start.Format(time.StampMicro), a.err)
		}
		if a.uid == victim && a.start.After(deleting) {
			late++
		}
	}
	t.Logf("%d requests during the scale-down; victim %s (%s) deletion seen at %s", len(answers), victim, names[victim], deleting.Format(time.StampMicro))
	if failed > 0 {
		t.Errorf("%d of %d requests failed during the scale-down", failed, len(answers))
	}
	if late > 0 {
		t.Errorf("%d requests started after the victim's deletion began were answered by it", late)
	}
	if d := metric(t, "skipper_noderouter_evictions_total", nil) - evictions; d != 0 {
		t.Errorf("evictions_total rose by %v: the router met a dead instance (traffic did not stop before deletion)", d)
	}
	if d := metric(t, "skipper_noderouter_retries_total", nil) - retries; d != 0 {
		t.Errorf("retries_total rose by %v during the scale-down", d)
	}
}

// load calls a function from worker goroutines until stopped, counting
// calls, failures and the answers of each pod.
type load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	sent   int
	failed int
	byPod  map[string]int
}

// startLoad calls fn at path from workers goroutines, each pausing pause
// between calls, until stop (or the test's end).
func startLoad(t *testing.T, fn, path string, workers int, pause time.Duration) *load {
	ctx, cancel := context.WithCancel(t.Context())
	l := &load{cancel: cancel, byPod: map[string]int{}}
	for range workers {
		l.wg.Go(func() {
			for ctx.Err() == nil {
				_, uid, err := call(ctx, fn, path)
				if ctx.Err() != nil {
					return
				}
				l.mu.Lock()
				l.sent++
				if err != nil {
					l.failed++
					t.Logf("request failed: %v", err)
				} else {
					l.byPod[uid]++
				}
				l.mu.Unlock()
				if pause > 0 {
					time.Sleep(pause) // sleep: load (the caller's pace)
				}
			}
		})
	}
	t.Cleanup(func() { l.stop() })
	return l
}

// answersFrom is how many calls the pod with uid has answered so far.
func (l *load) answersFrom(uid string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byPod[uid]
}

// stop ends the load, waits for the calls in flight, and returns the counts.
func (l *load) stop() (sent, failed int) {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent, l.failed
}

// TestInstanceKilledMidLoadLosesNoIdempotentRequest kills one of two
// instances (its pod deleted with no grace period: the process dies at
// once) under concurrent GET load with requests in flight on it: every
// request still succeeds, retried on the other instance.
func TestInstanceKilledMidLoadLosesNoIdempotentRequest(t *testing.T) {
	fn := createFunction(t, "kill", map[string]any{"minInstances": int64(2), "maxInstances": int64(2)})
	waitBothInstances(t, fn)
	pods, err := env.kube.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + fn})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("list instances: %v (%d)", err, len(pods.Items))
	}
	victim := pods.Items[0]

	const workers = 8
	load := startLoad(t, fn, "/?sleep=100ms", workers, 0)
	// Kill while requests are in flight on the victim.
	poll.Until(t, 10*time.Second, pollInterval, "the victim serving under load", func(context.Context) error {
		if n := load.answersFrom(string(victim.UID)); n < workers {
			return fmt.Errorf("%d answers from the victim", n)
		}
		return nil
	})
	retries := metric(t, "skipper_noderouter_retries_total", nil)
	zero := int64(0)
	if err := env.kube.CoreV1().Pods(namespace).Delete(t.Context(), victim.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("kill %s: %v", victim.Name, err)
	}
	time.Sleep(3 * time.Second) // sleep: load (across the death and the controller's reaction)
	sent, failed := load.stop()
	t.Logf("%d GET requests, %d retries by the router around the kill", sent, int(metric(t, "skipper_noderouter_retries_total", nil)-retries))
	if failed > 0 {
		t.Errorf("%d of %d idempotent requests failed when an instance was killed", failed, sent)
	}
}

// TestControllerRestart deletes the controller replica that owns a warm
// function: requests keep being served from the cache throughout, the
// function gets a new owner, and the router's reports for it reach that
// owner over a stream of its own.
func TestControllerRestart(t *testing.T) {
	fn := createFunction(t, "restart", map[string]any{"maxInstances": int64(1)})
	poll.Until(t, 30*time.Second, pollInterval, "the cold call", func(ctx context.Context) error {
		_, _, err := call(ctx, fn, "/")
		return err
	})
	fns := env.dyn.Resource(v1alpha1.Resource).Namespace(namespace)
	owner := func(ctx context.Context) (string, error) {
		f, err := fns.Get(ctx, fn, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		o, _, _ := unstructured.NestedString(f.Object, "status", "owner")
		return o, nil
	}
	old, err := owner(t.Context())
	if err != nil || old == "" {
		t.Fatalf("owner %q: %v", old, err)
	}

	load := startLoad(t, fn, "/", 1, 10*time.Millisecond)

	if err := env.kube.CoreV1().Pods("skipper-system").Delete(t.Context(), old, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete controller %s: %v", old, err)
	}
	var next string
	poll.Until(t, 90*time.Second, pollInterval, "a new owner", func(ctx context.Context) (err error) {
		if next, err = owner(ctx); err != nil {
			return err
		}
		if next == "" || next == old {
			return fmt.Errorf("owner is %q", next)
		}
		return nil
	})
	p, err := env.kube.CoreV1().Pods("skipper-system").Get(t.Context(), next, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := p.Status.PodIP + ":9090"
	batches := func() float64 {
		return metric(t, "skipper_noderouter_heartbeat_batches_total", map[string]string{"controller": addr})
	}
	var first float64
	poll.Until(t, 60*time.Second, pollInterval, "reports to the new owner "+next+" at "+addr, func(context.Context) error {
		b := batches()
		if first == 0 {
			first = b
		}
		if b <= first {
			return fmt.Errorf("%v report batches to %s", b, addr)
		}
		return nil
	})
	sent, failed := load.stop()
	t.Logf("owner %s → %s; %d requests during the restart", old, next, sent)
	if failed > 0 {
		t.Errorf("%d of %d warm requests failed while the owning controller restarted", failed, sent)
	}
}

// TestOneshot: every request to a oneshot function is served by a fresh
// instance the owner hands out (one GetInstance per request by design),
// released by the router after the response and then deleted.
func TestOneshot(t *testing.T) {
	fn := createFunction(t, "once", map[string]any{"oneshot": true, "maxInstances": int64(3)})
	gets := metric(t, getInstances, nil)
	released := metric(t, "skipper_noderouter_release_instance_total", map[string]string{"result": "ok"})
	const n = 3
	seen := map[string]bool{}
	for i := range n {
		var uid string
		// Each request claims a pool pod: give the pool time to refill.
		poll.Until(t, 60*time.Second, pollInterval, fmt.Sprintf("oneshot request %d", i), func(ctx context.Context) (err error) {
			_, uid, err = call(ctx, fn, "/")
			return err
		})
		if seen[uid] {
			t.Errorf("request %d served by %s, which already served one", i, uid)
		}
		seen[uid] = true
	}
	if d := metric(t, getInstances, nil) - gets; d < n {
		t.Errorf("%v GetInstance calls for %d oneshot requests; want one each", d, n)
	}
	poll.Until(t, 10*time.Second, pollInterval, "every instance released", func(context.Context) error {
		if d := metric(t, "skipper_noderouter_release_instance_total", map[string]string{"result": "ok"}) - released; d != n {
			return fmt.Errorf("%v released", d)
		}
		return nil
	})
	poll.Until(t, 60*time.Second, pollInterval, "the used instances deleted", func(ctx context.Context) error {
		pods, err := env.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if seen[string(p.UID)] && p.DeletionTimestamp == nil {
				return fmt.Errorf("pod %s still runs", p.Name)
			}
		}
		return nil
	})
}

// TestInstanceCgroupsReadable: the router's cgroup reader finds the pods
// the kubelets run (below --cgroup-root=/skipper, named by the kubelet's
// cgroupfs driver and runc) and reads their CPU and memory.
// Any node's: the pool's pods may all run on one node.
func TestInstanceCgroupsReadable(t *testing.T) {
	r, err := cgroup.Open("", "/skipper")
	if err != nil {
		t.Fatalf("open cgroups: %v", err)
	}
	pods, err := env.kube.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{
		LabelSelector: v1alpha1.LabelPool + "=echo", FieldSelector: "status.phase=Running"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatal("no running echo pod")
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			// Its processes and cgroup may be gone already while the API
			// still says Running (an instance an earlier test left to idle
			// out, a pool pod its ReplicaSet scaled away).
			continue
		}
		u, err := r.Read(string(p.UID), time.Now())
		if err != nil {
			t.Errorf("pod %s: %v", p.Name, err)
			continue
		}
		if !u.HasCPU || !u.HasMemory || u.Memory == 0 || u.CPU == 0 {
			t.Errorf("pod %s: %+v; want its CPU time and a working set", p.Name, u)
		}
	}
}

// TestConcurrencyLimitQueues: the Function's concurrencyLimit reaches the
// router with its instance set; with one instance and a limit of 1, two
// concurrent requests are served one after the other (the second waits in
// the router's queue), both successfully.
func TestConcurrencyLimitQueues(t *testing.T) {
	fn := createFunction(t, "limit", map[string]any{"maxInstances": int64(1), "concurrencyLimit": int64(1)})
	poll.Until(t, 30*time.Second, pollInterval, "the cold call", func(ctx context.Context) error {
		_, _, err := call(ctx, fn, "/")
		return err
	})
	const sleep = 500 * time.Millisecond
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			if _, _, err := call(t.Context(), fn, "/?sleep="+sleep.String()); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("limited call: %v", err)
	}
	if d := time.Since(start); d < 2*sleep {
		t.Errorf("two requests at concurrencyLimit 1 on one instance took %s; want them one after the other (≥ %s)", d, 2*sleep)
	}
}
