package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// burstConfig is skipper-bench burst's flags.
type burstConfig struct {
	n          int
	spread     time.Duration
	poolMin    int
	poolMax    int
	window     time.Duration
	headroom   int
	like       string
	namespace  string
	envFile    string
	settleWait time.Duration
	verbose    bool
}

// burstCall is one first call of the burst.
type burstCall struct {
	function string
	start    time.Time
	took     time.Duration
	podUID   string // the instance that answered, by its own account
	err      error
}

// echoAnswer is the part of the echo runtime's answer the burst reads.
type echoAnswer struct {
	Pod struct {
		UID string `json:"uid"`
	} `json:"pod"`
}

// runBurst is skipper-bench burst: n new Functions on an autoscaled pool
// of its own, each called once, the calls spread over a few seconds; it
// reports how many were served by a pod that was ready before the call
// began, and the pool's replicas as it grows and shrinks back.
func runBurst(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c burstConfig
	fs := flag.NewFlagSet("burst", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.n, "n", 30, "new Functions, one first call each")
	fs.DurationVar(&c.spread, "spread", 3*time.Second, "the calls start evenly over this span")
	fs.IntVar(&c.poolMin, "pool-min", 3, "the pool's skipper.dev/pool-min (its size before the burst)")
	fs.IntVar(&c.poolMax, "pool-max", 40, "the pool's skipper.dev/pool-max")
	fs.DurationVar(&c.window, "window", 10*time.Second, "the pool's skipper.dev/pool-window")
	fs.IntVar(&c.headroom, "headroom", 1, "the pool's skipper.dev/pool-headroom")
	fs.StringVar(&c.like, "like", "echo", "the pool Deployment whose pod template the bench's pool copies")
	fs.StringVar(&c.namespace, "namespace", "default", "namespace of the pools and Functions")
	fs.StringVar(&c.envFile, "env", ".skipper/env", "the local cluster's env file")
	fs.DurationVar(&c.settleWait, "settle", 2*time.Minute, "how long to wait for the pool to be ready before, and back at its minimum after")
	fs.BoolVar(&c.verbose, "v", false, "also list every call: when it began and took, and when its pod was seen created and ready (from the first call)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.n < 1 || c.spread < 0 || c.poolMin < 1 || c.poolMax < c.poolMin {
		return fmt.Errorf("want -n ≥ 1, -spread ≥ 0, 1 ≤ -pool-min ≤ -pool-max")
	}
	env, kcfg, cs, err := attach(c.envFile, "ROUTER_URL")
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(kcfg)
	if err != nil {
		return err
	}
	const pool = "skipper-bench-burst"
	deps := cs.AppsV1().Deployments(c.namespace)
	like, err := deps.Get(ctx, c.like, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("pool Deployment %s to copy: %w", c.like, err)
	}
	d := burstPool(like, pool, c)
	cleanup := &cleanups{}
	defer cleanup.run()
	if _, err := deps.Create(ctx, d, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create pool %s: %w", pool, err)
	}
	cleanup.add(func() { _ = deps.Delete(context.WithoutCancel(ctx), pool, metav1.DeleteOptions{}) })

	// Pod readiness, as this watch sees it: when each pool pod was first
	// seen ready (pods ready at the watch's start: at its start).
	readyAt := newReadyLog()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchStarted := time.Now()
	if err := readyAt.watch(wctx, cs, c.namespace, pool, watchStarted); err != nil {
		return err
	}
	replicas := newReplicaLog()
	if err := replicas.watch(wctx, cs, c.namespace, pool); err != nil {
		return err
	}
	if err := waitPool(ctx, cs, c.namespace, pool, c.poolMin, c.settleWait); err != nil {
		return err
	}

	fns := dyn.Resource(v1alpha1.Resource).Namespace(c.namespace)
	prefix := fmt.Sprintf("burst-%d-", time.Now().Unix()%100000)
	names := make([]string, c.n)
	for i := range c.n {
		names[i] = fmt.Sprintf("%s%d", prefix, i)
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "Function",
			"metadata": map[string]any{"name": names[i], "namespace": c.namespace},
			"spec":     map[string]any{"pool": pool, "maxInstances": int64(1), "idleTimeout": "5m"},
		}}
		if _, err := fns.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Function %s: %w", names[i], err)
		}
	}
	cleanup.add(func() {
		for _, n := range names {
			_ = fns.Delete(context.WithoutCancel(ctx), n, metav1.DeleteOptions{})
		}
	})
	// Each Function's owner has seen it (a call before would be a 404,
	// not a cold start).
	if err := waitOwned(ctx, fns, names, c.settleWait); err != nil {
		return err
	}

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: c.n}}
	calls := make([]burstCall, c.n)
	var wg sync.WaitGroup
	begin := time.Now()
	for i := range c.n {
		at := begin.Add(time.Duration(i) * c.spread / time.Duration(max(c.n-1, 1)))
		wg.Go(func() {
			time.Sleep(time.Until(at))
			calls[i] = burstOne(ctx, client, env["ROUTER_URL"], c.namespace+"/"+names[i])
		})
	}
	wg.Wait()
	end := time.Now()

	var failed []string
	warmServed := 0
	var lat []time.Duration
	served := make([]bool, len(calls)) // by a pod ready before the call began
	for i, cl := range calls {
		if cl.err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", cl.function, cl.err))
			continue
		}
		lat = append(lat, cl.took)
		if t, ok := readyAt.at(cl.podUID); ok && t.Before(cl.start) {
			served[i] = true
			warmServed++
		}
	}
	peak, _ := replicas.max(begin)
	// Back at the minimum: the claims leave the window.
	shrunk, shrinkErr := replicas.waitAt(ctx, int32(c.poolMin), end, c.window+c.settleWait)
	fmt.Fprintf(stdout, "burst: %d new Functions on autoscaled pool %s/%s (pool-min %d, pool-max %d, window %s, headroom %d), first calls spread over %s (took %s)\n",
		c.n, c.namespace, pool, c.poolMin, c.poolMax, c.window, c.headroom, c.spread, end.Sub(begin).Round(time.Millisecond))
	fmt.Fprintf(stdout, "  served by a pod ready before the call began: %d of %d\n", warmServed, c.n)
	if len(lat) > 0 {
		fmt.Fprintf(stdout, "  first call: %s\n", summary(lat))
	}
	if starts, created := readyAt.starts(begin); len(starts) > 0 {
		fmt.Fprintf(stdout, "  pool pods created from the first call on: %d; seen created → ready: %s\n", created, summary(starts))
	}
	fmt.Fprintf(stdout, "  pool replicas: %d before, %d at the peak, %s\n", c.poolMin, peak, shrunk)
	fmt.Fprintf(stdout, "  replicas over time (from the first call): %s\n", replicas.timeline(begin))
	if c.verbose {
		for _, line := range readyAt.callLines(calls, served, begin) {
			fmt.Fprintln(stdout, "  "+line)
		}
	}
	for _, f := range failed {
		fmt.Fprintf(stdout, "  failed: %s\n", f)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d first calls failed", len(failed), c.n)
	}
	return shrinkErr
}

// burstPool is the bench's own pool: like's pod template under pool's
// label, autoscaled with c's annotations, no replicas (the autoscaler's).
func burstPool(like *appsv1.Deployment, pool string, c burstConfig) *appsv1.Deployment {
	tpl := *like.Spec.Template.DeepCopy()
	tpl.Labels = map[string]string{v1alpha1.LabelPool: pool}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: pool, Namespace: like.Namespace,
			Labels: map[string]string{v1alpha1.LabelPool: pool},
			Annotations: map[string]string{
				v1alpha1.AnnotationAutoscale: "true",
				"skipper.dev/pool-min":       strconv.Itoa(c.poolMin),
				"skipper.dev/pool-max":       strconv.Itoa(c.poolMax),
				"skipper.dev/pool-window":    c.window.String(),
				"skipper.dev/pool-headroom":  strconv.Itoa(c.headroom),
			}},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{
				MatchLabels:      map[string]string{v1alpha1.LabelPool: pool},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: v1alpha1.LabelFunction, Operator: metav1.LabelSelectorOpDoesNotExist}},
			},
			Template: tpl,
		},
	}
}

// burstOne makes one first call and reads which instance answered.
func burstOne(ctx context.Context, client *http.Client, routerURL, function string) burstCall {
	c := burstCall{function: function, start: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, routerURL+"/burst", nil)
	if err != nil {
		c.err = err
		return c
	}
	req.Header.Set("x-skipper-function", function)
	resp, err := client.Do(req)
	if err != nil {
		c.err = err
		return c
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	c.took = time.Since(c.start)
	if resp.StatusCode != http.StatusOK {
		c.err = fmt.Errorf("%d %s", resp.StatusCode, body)
		return c
	}
	var a echoAnswer
	if err := json.Unmarshal(body, &a); err != nil || a.Pod.UID == "" {
		c.err = fmt.Errorf("answer without the instance's pod: %s", body)
	}
	c.podUID = a.Pod.UID
	return c
}

// waitPool polls until the pool has want ready warm pods.
func waitPool(ctx context.Context, cs kubernetes.Interface, ns, pool string, want int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + pool + ",!" + v1alpha1.LabelFunction})
		n := 0
		if err == nil {
			for _, p := range pods.Items {
				if ready(p) && p.DeletionTimestamp == nil {
					n++
				}
			}
			if n >= want {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pool %s/%s: %d of %d warm pods ready within %s (%v)", ns, pool, n, want, timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitOwned polls until every named Function's status names its owner.
func waitOwned(ctx context.Context, fns dynamic.ResourceInterface, names []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		list, err := fns.List(ctx, metav1.ListOptions{})
		owned := 0
		if err == nil {
			for _, o := range list.Items {
				if owner, _, _ := unstructured.NestedString(o.Object, "status", "owner"); owner != "" && slices.Contains(names, o.GetName()) {
					owned++
				}
			}
			if owned == len(names) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d Functions owned within %s (%v)", owned, len(names), timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
