// Command skipper-bench measures the local cluster from outside, the way a
// caller sees it. It attaches through .skipper/env (start a cluster with
// `make up` first, or let `make bench-coldstart` do it).
//
//	skipper-bench coldstart [-n 50] [-pool echo] [-namespace default] [-path /bench]
//	skipper-bench burst [-n 30] [-spread 3s] [-pool-min 3] [-pool-max 40] [-window 10s] [-v]
//	skipper-bench vip [-n 2000] [-node 2] [-function default/echo]
//	skipper-bench soak [-d 10m] [-functions 500] [-batch 10] [-callers 4] [-settle 90s]
//	skipper-bench hops [-n 40] [-idle 300ms]
//	skipper-bench podstart [-n 30] [-parallel 1] [-pool echo]
//	skipper-bench warm [-rounds 5] [-duration 5s] [-connections 64] [-rate 1000] [-contenders direct,router,nginx,haproxy,fasthttp,vip,kube-proxy] [-docs docs/benchmarks.md]
//
// coldstart creates n Functions on the pool, and for each one waits until
// the cluster is quiet (the pool has a ready warm pod and none starting, the
// pool Deployment's status is current, and the previous Function's instance
// is gone), then times the function's first call (claim patch + assign +
// proxy, through the router at ROUTER_URL) and a second, warm call on the
// same connection, and deletes the Function. Each sample is thus one cold
// start on an otherwise idle cluster, not one among a growing crowd of
// functions that idle out and scale to zero mid-run. It prints
// p50/p90/p99/max of both.
//
// burst is issue 15's burst against the pool autoscaler (see burst.go): a
// pool of its own, annotated skipper.dev/autoscale, n new Functions on it
// whose first calls start evenly over -spread; it reports how many were
// served by a pod that was ready (as its watch saw it) before the call
// began, the pool's replicas as it grows, and when it is back at its
// minimum after the window.
//
// vip compares, for a caller on one node, the skipper Service VIP steered by
// BPF, the VIP through kube-proxy, and the router's addresses dialled
// directly: connect+request latency p50/p99 and requests/s (see vip.go).
//
// soak is issue 13's soak (see soak.go): while callers call default/echo
// through the router without pause, it creates Functions in batches on the
// pool, calls each once, and deletes them, spreading -functions over -d.
// It reads the RSS and goroutine count of node 1's router and of each
// controller replica (ROUTER_METRICS_URL, CONTROLLER_METRICS_URLS) after a
// warm-up and again -settle after the loop, prints a markdown table of
// both with PASS/FAIL against ±10% (goroutines: or ±20), and exits
// non-zero when a process is outside the bound.
//
// hops times coldstart's hops as bare TCP round trips between idle
// processes that do no work, each in the network namespace of the part it
// stands for (see hops.go): the floor of coldstart's first/second ratio on
// the machine.
//
// podstart times pod starts as the kubelet does them (see podstart.go):
// bare pods from the pool's template, created -> Ready p50/p90.
//
// warm is issue 14's comparison of warm requests (see warm.go): a closed
// loop (wrk) and an open loop at a fixed rate, the contenders interleaved
// in every round, against one instance of a Function it makes: directly,
// through node 1's router (by its IP and through the Service VIP), and
// through nginx, haproxy and a minimal fasthttp proxy (fastproxy, from
// tests/fastproxy) run beside the router; with the proxies' CPU per
// request. It rewrites its section of docs/benchmarks.md and writes
// docs/bench/warm.json (and plots, with skipper-benchplot from
// tests/benchplot). `sudo bash .ci/install-bench` installs wrk, nginx and
// haproxy; `make bench` builds fastproxy and skipper-benchplot into bin/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/tests/cluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "skipper-bench:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "vip":
			return runVIP(ctx, args[1:], stdout, stderr)
		case "burst":
			return runBurst(ctx, args[1:], stdout, stderr)
		case "vip-client":
			return runVIPClient(ctx, args[1:], stdout, stderr)
		case "soak":
			return runSoak(ctx, args[1:], stdout, stderr)
		case "warm":
			return runWarm(ctx, args[1:], stdout, stderr)
		case "warm-open":
			return runWarmOpen(ctx, args[1:], stdout, stderr)
		case "hops":
			return runHops(ctx, args[1:], stdout, stderr)
		case "hops-role":
			return runHopsRole(ctx, args[1:], stderr)
		case "podstart":
			return runPodStart(ctx, args[1:], stdout, stderr)
		}
	}
	if len(args) == 0 || args[0] != "coldstart" {
		fmt.Fprintln(stderr, "usage: skipper-bench coldstart|burst|vip|soak|warm|hops|podstart [flags]   (skipper-bench warm --help)")
		return flag.ErrHelp
	}
	fs := flag.NewFlagSet("coldstart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 50, "number of fresh Functions, one cold call each")
	pool := fs.String("pool", "echo", "pool the Functions use")
	ns := fs.String("namespace", "default", "namespace of the pool and the Functions")
	path := fs.String("path", "/bench", "path each call GETs; it must answer 200 (go-httpbin's pool: /get)")
	envFile := fs.String("env", ".skipper/env", "the local cluster's env file")
	warmWait := fs.Duration("warm-wait", 60*time.Second, "how long to wait before each call for the cluster to be quiet: "+
		"a ready warm pod and none starting, the pool Deployment's status current, the previous Function's instance gone")
	emptyPool := fs.Bool("empty-pool", false, "measure with an empty pool instead: before each call the pool Deployment is scaled to 0 "+
		"until no warm pod is left, the call is made, and the pool is scaled back to 1 at once (pod start + claim); "+
		"the pool's replica count is restored at the end")
	marks := fs.Bool("marks", false, "print each first call's start and end on CLOCK_MONOTONIC (seconds) to stderr, "+
		"to find the call in a trace of 'perf sched record -k CLOCK_MONOTONIC'")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *n < 1 {
		return fmt.Errorf("-n must be at least 1, got %d", *n)
	}
	env, cfg, cs, err := attach(*envFile, "ROUTER_URL")
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	fns := dyn.Resource(v1alpha1.Resource).Namespace(*ns)
	prefix := fmt.Sprintf("bench-%d-", time.Now().Unix()%100000)
	defer func() {
		for i := range *n {
			_ = fns.Delete(context.WithoutCancel(ctx), fmt.Sprintf("%s%d", prefix, i), metav1.DeleteOptions{})
		}
	}()
	for i := range *n {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "Function",
			"metadata": map[string]any{"name": fmt.Sprintf("%s%d", prefix, i), "namespace": *ns},
			"spec":     map[string]any{"pool": *pool, "maxInstances": int64(1)},
		}}
		if _, err := fns.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Function %s: %w", obj.GetName(), err)
		}
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	var empty *emptier
	if *emptyPool {
		if empty, err = newEmptier(ctx, cs, *ns, *pool); err != nil {
			return err
		}
		defer empty.restore()
	}
	var cold, warm []time.Duration
	for i := range *n {
		name := fmt.Sprintf("%s/%s%d", *ns, prefix, i)
		var d time.Duration
		var err error
		if empty != nil {
			d, err = empty.call(ctx, func() (time.Duration, error) { return call(ctx, client, env["ROUTER_URL"]+*path, name) }, *warmWait)
		} else {
			if err := waitQuiet(ctx, cs, *ns, *pool, prefix, *warmWait); err != nil {
				return err
			}
			var ts0, ts1 unix.Timespec
			_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts0)
			d, err = call(ctx, client, env["ROUTER_URL"]+*path, name)
			_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts1)
			if *marks {
				fmt.Fprintf(stderr, "mark %d %.6f %.6f %s\n", i, float64(ts0.Nano())/1e9, float64(ts1.Nano())/1e9, d)
			}
		}
		if err != nil {
			return fmt.Errorf("cold call %d: %w", i, err)
		}
		cold = append(cold, d)
		if d, err = call(ctx, client, env["ROUTER_URL"]+*path, name); err != nil {
			return fmt.Errorf("warm call %d: %w", i, err)
		}
		warm = append(warm, d)
		if err := fns.Delete(ctx, fmt.Sprintf("%s%d", prefix, i), metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete Function %s%d: %w", prefix, i, err)
		}
	}
	fmt.Fprintf(stdout, "coldstart: %d fresh Functions on pool %s/%s, router %s\n", *n, *ns, *pool, env["ROUTER_URL"])
	what := "warm pool"
	if empty != nil {
		what = "empty pool"
	}
	fmt.Fprintf(stdout, "  first call (%s): %s\n", what, summary(cold))
	fmt.Fprintf(stdout, "  second call (warm):     %s\n", summary(warm))
	return nil
}

// attach reads the local cluster's env file, checks that it sets KUBECONFIG
// and each of need, and returns it with a client of the cluster.
func attach(envFile string, need ...string) (map[string]string, *rest.Config, kubernetes.Interface, error) {
	env, err := cluster.ReadEnv(envFile)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read %s (is a cluster up?): %w", envFile, err)
	}
	for _, k := range append([]string{"KUBECONFIG"}, need...) {
		if env[k] == "" {
			return nil, nil, nil, fmt.Errorf("%s: %s is not set", envFile, k)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", env["KUBECONFIG"])
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	// Built-in kinds as protobuf, as the cluster's own clients: the bench's
	// watches then cost the API server no JSON encoding of its own.
	pc := rest.CopyConfig(cfg)
	pc.ContentType = runtime.ContentTypeProtobuf
	pc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cs, err := kubernetes.NewForConfig(pc)
	if err != nil {
		return nil, nil, nil, err
	}
	return env, cfg, cs, nil
}

// call GETs url with the header naming function and returns how long it
// took to the end of the body; anything but 200 is an error.
func call(ctx context.Context, c *http.Client, url, function string) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("x-skipper-function", function)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %d %s", function, resp.StatusCode, body)
	}
	return d, nil
}

// waitQuiet polls until noisy finds nothing that would compete with the
// next cold call on a 2-core machine.
func waitQuiet(ctx context.Context, cs kubernetes.Interface, ns, pool, prefix string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var why string
	for {
		if why = noisy(ctx, cs, ns, pool, prefix); why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not quiet within %s: %s", timeout, why)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// noisy says what keeps the cluster from being quiet for the next cold
// call, or "" when nothing does: a replacement pool pod starting, the kube
// controllers still writing the pool's status, or an instance of an earlier
// bench Function still being deleted would compete with the call on a small
// machine.
func noisy(ctx context.Context, cs kubernetes.Interface, ns, pool, prefix string) string {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + pool})
	if err != nil {
		return err.Error()
	}
	warm, starting := 0, 0
	for _, p := range pods.Items {
		fn := p.Labels[v1alpha1.LabelFunction]
		switch {
		case strings.HasPrefix(fn, prefix):
			return "instance " + p.Name + " of an earlier bench Function is still there"
		case fn != "":
		case p.DeletionTimestamp != nil:
		case ready(p):
			warm++
		default:
			starting++
		}
	}
	if warm == 0 || starting > 0 {
		return fmt.Sprintf("pool %s/%s has %d ready warm pods and %d starting", ns, pool, warm, starting)
	}
	deploys, err := cs.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + pool})
	if err != nil {
		return err.Error()
	}
	for _, d := range deploys.Items {
		st := d.Status
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		if st.ObservedGeneration < d.Generation || st.Replicas != want || st.ReadyReplicas != want ||
			st.AvailableReplicas != want || st.UpdatedReplicas != want {
			return fmt.Sprintf("pool Deployment %s/%s status not current", ns, d.Name)
		}
	}
	return ""
}

func ready(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func summary(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	r := func(d time.Duration) string { return d.Round(10 * time.Microsecond).String() }
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  max %s  (n=%d)", r(q(0.50)), r(q(0.90)), r(q(0.99)), r(s[len(s)-1]), len(s))
}
