package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

// The local overlay runs the controllers with --scale-down-stabilization=10s,
// --drain-timeout=10s and --scale-interval=500ms; the waits below are sized
// from those.

// createFunction creates Function default/<name> on the echo pool with
// spec merged over maxInstances 3, and deletes it when the test ends (the
// garbage collector removes its instances).
func createFunction(t *testing.T, name string, spec map[string]any) {
	t.Helper()
	s := map[string]any{"pool": "echo", "maxInstances": int64(3)}
	for k, v := range spec {
		s[k] = v
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "Function",
		"metadata": map[string]any{"name": name, "namespace": "default"},
		"spec":     s,
	}}
	fns := env.dyn.Resource(v1alpha1.Resource).Namespace("default")
	if _, err := fns.Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Function %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := fns.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Function %s: %v", name, err)
		}
	})
}

// firstCall calls a just-created function until it answers: the contract
// gives a new Function 2s to become callable (the router's negative cache
// of unknown names expires within 1s).
func firstCall(t *testing.T, function string) string {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	var uid string
	poll.Until(t, 5*time.Second, pollInterval, "first call of "+function, func(context.Context) (err error) {
		uid, err = callPod(t, client, function, "")
		return err
	})
	return uid
}

// instances counts the function's claimed pods that are not terminating.
func instances(t *testing.T, name string) int {
	t.Helper()
	pods, err := env.kube.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + name})
	if err != nil {
		t.Fatalf("list instances of %s: %v", name, err)
	}
	n := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			n++
		}
	}
	return n
}

func functionStatus(t *testing.T, name string) map[string]any {
	t.Helper()
	u, err := env.dyn.Resource(v1alpha1.Resource).Namespace("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Function %s: %v", name, err)
	}
	st, _, _ := unstructured.NestedMap(u.Object, "status")
	return st
}

// callPod calls the function and returns the UID of the pod that answered;
// any status but 200 fails the test.
func callPod(t *testing.T, client *http.Client, function, query string) (string, error) {
	req, err := http.NewRequest(http.MethodGet, env.routerURL+"/scale?"+query, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("x-skipper-function", function)
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%d: %s", resp.StatusCode, b)
	}
	var body struct {
		Pod struct {
			UID string `json:"uid"`
		} `json:"pod"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return "", fmt.Errorf("decode %s: %w", b, err)
	}
	return body.Pod.UID, nil
}

// load runs workers callers, each calling the function in a loop with
// query, until stop is closed; it returns the number of calls and failures.
func load(t *testing.T, function, query string, workers int, stop <-chan struct{}) (calls, failures *atomic.Int64, wait func()) {
	calls, failures = &atomic.Int64{}, &atomic.Int64{}
	client := &http.Client{Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				calls.Add(1)
				if _, err := callPod(t, client, function, query); err != nil {
					failures.Add(1)
					t.Logf("call failed: %v", err)
				}
			}
		})
	}
	return calls, failures, wg.Wait
}

// TestScaleUpAndDownUnderLoad: three callers keeping a request each in
// flight against targetInFlight 1 scale the function to three instances;
// when the load drops to one caller the function goes back to one instance
// after the stabilization window, draining the others, and no request
// fails on the way.
func TestScaleUpAndDownUnderLoad(t *testing.T) {
	const fn = "scale-load"
	createFunction(t, fn, map[string]any{
		"scaling":     map[string]any{"targetInFlight": int64(1)},
		"idleTimeout": "5m",
	})
	ref := "default/" + fn
	firstCall(t, ref)

	stopHeavy := make(chan struct{})
	heavyCalls, heavyFailures, waitHeavy := load(t, ref, "sleep=400ms", 3, stopHeavy)
	start := time.Now()
	peak := 0
	poll.Until(t, 30*time.Second, 200*time.Millisecond, "three instances under load", func(context.Context) error {
		if peak = max(peak, instances(t, fn)); peak < 3 {
			return fmt.Errorf("at most %d instances", peak)
		}
		return nil
	})
	t.Logf("scaled to %d instances %s after load began", peak, time.Since(start).Round(100*time.Millisecond))
	// Status is written at most once per --status-interval (1s).
	poll.Until(t, 5*time.Second, 200*time.Millisecond, "status desired 3 for inFlight", func(context.Context) error {
		if st := functionStatus(t, fn); fmt.Sprint(st["desired"]) != "3" || st["lastScaleReason"] != "inFlight" {
			return fmt.Errorf("status %v", st)
		}
		return nil
	})

	// One caller from now on, a request in flight at a time: desired 1.
	stopLight := make(chan struct{})
	lightCalls, lightFailures, waitLight := load(t, ref, "sleep=50ms", 1, stopLight)
	close(stopHeavy)
	waitHeavy()
	down := time.Now()
	poll.Until(t, 60*time.Second, 200*time.Millisecond, "scale-down to one instance", func(context.Context) error {
		if n := instances(t, fn); n != 1 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
	took := time.Since(down)
	close(stopLight)
	waitLight()
	t.Logf("scaled down after %s; calls: %d heavy, %d light", took.Round(100*time.Millisecond), heavyCalls.Load(), lightCalls.Load())
	if took < 8*time.Second {
		t.Errorf("scaled down %s after the load dropped, before the 10s stabilization window", took)
	}
	if n := heavyFailures.Load() + lightFailures.Load(); n > 0 {
		t.Errorf("%d calls failed during scale-up and scale-down", n)
	}
	poll.Until(t, 5*time.Second, 200*time.Millisecond, "status desired 1 with an owner", func(context.Context) error {
		if st := functionStatus(t, fn); fmt.Sprint(st["desired"]) != "1" || st["owner"] == nil {
			return fmt.Errorf("status %v", st)
		}
		return nil
	})
}

// TestScaleToZeroAfterIdle: with minInstances 0 the last instance goes
// after idleTimeout, and the next call claims a new one.
func TestScaleToZeroAfterIdle(t *testing.T) {
	const fn = "scale-idle"
	createFunction(t, fn, map[string]any{"idleTimeout": "3s"})
	ref := "default/" + fn
	client := &http.Client{Timeout: 30 * time.Second}
	first := firstCall(t, ref)
	idle := time.Now()
	// The claim's record follows the call (issue 15): count from when the
	// pod shows it.
	poll.Until(t, 5*time.Second, 200*time.Millisecond, "the claim recorded", func(context.Context) error {
		if n := instances(t, fn); n != 1 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
	poll.Until(t, 40*time.Second, 200*time.Millisecond, "scale to zero", func(context.Context) error {
		if n := instances(t, fn); n != 0 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
	t.Logf("scaled to zero %s after the last call", time.Since(idle).Round(100*time.Millisecond))
	if time.Since(idle) < 3*time.Second {
		t.Errorf("scaled to zero before idleTimeout")
	}
	poll.Until(t, 10*time.Second, 200*time.Millisecond, "status desired 0 reason idle", func(context.Context) error {
		if st := functionStatus(t, fn); fmt.Sprint(st["desired"]) != "0" || st["lastScaleReason"] != "idle" {
			return fmt.Errorf("status %v", st)
		}
		return nil
	})
	again, err := callPod(t, client, ref, "")
	if err != nil {
		t.Fatalf("call after scale to zero: %v", err)
	}
	if again == first {
		t.Errorf("the call after scale to zero was answered by the deleted pod %s", first)
	}
}

// TestOneshotFreshInstancePerCall: every call of a oneshot function gets a
// pod of its own, deleted after the call.
func TestOneshotFreshInstancePerCall(t *testing.T) {
	const fn = "oneshot"
	createFunction(t, fn, map[string]any{"oneshot": true})
	ref := "default/" + fn
	client := &http.Client{Timeout: 30 * time.Second}
	seen := map[string]bool{firstCall(t, ref): true}
	for i := 1; i < 4; i++ {
		uid, err := callPod(t, client, ref, "")
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if seen[uid] {
			t.Fatalf("call %d was answered by pod %s again", i, uid)
		}
		seen[uid] = true
	}
	poll.Until(t, 30*time.Second, 200*time.Millisecond, "the used oneshot pods deleted", func(context.Context) error {
		pods, err := env.kube.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + fn})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if seen[string(p.UID)] && p.DeletionTimestamp == nil {
				return fmt.Errorf("%s not deleted", p.Name)
			}
		}
		return nil
	})
}
