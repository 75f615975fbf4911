package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"skipper.dev/skipper/controller/api/v1alpha1"
	// Named for what it gives here: main.go has a func attach.
)

const (
	// soakPrefix starts the name of every Function the soak creates; the
	// cleanup deletes whatever Functions with it are left, this run's or
	// an interrupted earlier one's.
	soakPrefix = "soak-"
	// soakWarmup is how long the callers run in the warm-up.
	soakWarmup = 20 * time.Second
	// soakReadings readings soakReadingGap apart make one reading (their
	// median), to keep a GC cycle or a burst of goroutines out of it.
	soakReadings   = 3
	soakReadingGap = 2 * time.Second
	// soakTolerance is the bound of issue 13: each process's RSS and
	// goroutine count end within ±10% of where they started.
	soakTolerance = 0.10
	// soakGoroutineSlack is an absolute bound on goroutines that holds
	// when it is wider than soakTolerance: a count of 60 moves by more
	// than 6 when a few connections come or go.
	soakGoroutineSlack = 20
)

// soakCounts is what the soak did, written by the callers and the loop.
type soakCounts struct {
	mu              sync.Mutex
	created         int
	deleted         int
	calls           int
	failures        int            // callers' calls that did not answer 200
	firstFailure    string         // the first of them, to say why
	first           map[string]int // first calls by outcome: "200", "503 (Retry-After)", "error"
	firstCallErrMsg string         // the first first call that got no answer, to say why
}

// runSoak is the soak of issue 13: Functions created and deleted in a loop
// while calls run, and the router's and controllers' RSS and goroutine
// counts compared before and after.
func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("d", 10*time.Minute, "how long the create/call/delete loop runs at most; the Functions are spread over it")
	functions := fs.Int("functions", 500, "Functions created (and deleted) in all; the loop ends early once they are")
	batch := fs.Int("batch", 10, "Functions that exist at once: each batch is created, called once each (concurrently), and deleted")
	pool := fs.String("pool", "echo", "pool the Functions use")
	ns := fs.String("namespace", "default", "namespace of the pool and the Functions")
	settle := fs.Duration("settle", 90*time.Second, "wait after the loop (callers stopped) before the final reading")
	envFile := fs.String("env", ".skipper/env", "the local cluster's env file (ROUTER_URL, ROUTER_METRICS_URL, CONTROLLER_METRICS_URLS)")
	warmFunctions := fs.Int("warmup-functions", 50, "Functions created, called and deleted during the warm-up, before the starting reading: "+
		"the first claims and deletions page in code and grow runtime pools once, which is not a leak")
	callers := fs.Int("callers", 4, "goroutines calling -function through ROUTER_URL back to back during the whole run (warm-up and loop)")
	function := fs.String("function", "default/echo", "function the callers call (namespace/name; it must exist)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var errs []error
	if *duration <= 0 {
		errs = append(errs, fmt.Errorf("-d must be positive, got %s", *duration))
	}
	if *functions < 1 || *batch < 1 {
		errs = append(errs, fmt.Errorf("-functions and -batch must be at least 1, got %d and %d", *functions, *batch))
	}
	if *callers < 0 || *settle < 0 {
		errs = append(errs, fmt.Errorf("-callers and -settle must not be negative, got %d and %s", *callers, *settle))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}

	env, cfg, _, err := attach(*envFile, "ROUTER_URL", "ROUTER_METRICS_URL", "CONTROLLER_METRICS_URLS")
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	fns := dyn.Resource(v1alpha1.Resource).Namespace(*ns)
	procs := soakProcesses(env)
	routerURL := env["ROUTER_URL"]
	counts := &soakCounts{first: map[string]int{}}

	defer func() {
		// On Ctrl-C too: ctx is main's signal context.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		n, err := deleteSoakFunctions(cctx, fns)
		if n > 0 || err != nil {
			fmt.Fprintf(stderr, "soak: cleanup deleted %d leftover %s* Functions in %s (err: %v)\n", n, soakPrefix, *ns, err)
		}
	}()
	if n, err := deleteSoakFunctions(ctx, fns); err != nil {
		return fmt.Errorf("delete earlier %s* Functions: %w", soakPrefix, err)
	} else if n > 0 {
		fmt.Fprintf(stderr, "soak: deleted %d %s* Functions an earlier run left in %s\n", n, soakPrefix, *ns)
	}

	callClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: max(*callers, 1)}}
	// startCallers runs the callers until the stop it returns is called.
	// Both readings are taken with the callers stopped and the cluster
	// settled, so they compare like with like.
	startCallers := func() (stop func()) {
		callCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for range *callers {
			wg.Go(func() { counts.runCaller(callCtx, callClient, routerURL, *function) })
		}
		var once sync.Once
		return func() {
			once.Do(func() {
				cancel()
				wg.Wait()
				// Nothing calls any more: let the router close the callers'
				// connections rather than hold them into the reading.
				callClient.CloseIdleConnections()
			})
		}
	}
	stopCallers := startCallers()
	defer func() { stopCallers() }()

	fmt.Fprintf(stderr, "soak: %d callers on %s, warm-up %s and %d Functions\n", *callers, *function, soakWarmup, *warmFunctions)
	firstClient := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: *batch}}
	runID := time.Now().Unix() % 100000
	warm := &soakCounts{first: map[string]int{}}
	for warm.created < *warmFunctions {
		names := make([]string, min(*batch, *warmFunctions-warm.created))
		for i := range names {
			names[i] = fmt.Sprintf("%s%d-w%d", soakPrefix, runID, warm.created+i)
		}
		if err := warm.runBatch(ctx, fns, firstClient, routerURL, *ns, *pool, names); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	if err := pause(ctx, soakWarmup); err != nil {
		return err
	}
	stopCallers()
	firstClient.CloseIdleConnections()
	fmt.Fprintf(stderr, "soak: warm-up done; settling %s before the starting reading\n", *settle)
	if err := pause(ctx, *settle); err != nil {
		return err
	}
	start, err := read(ctx, procs)
	if err != nil {
		return fmt.Errorf("starting reading: %w", err)
	}

	stopCallers = startCallers()
	batches := (*functions + *batch - 1) / *batch
	every := *duration / time.Duration(batches) // pace: the batches spread over -d
	began := time.Now()
	lastProgress := began
	for k := 0; counts.created < *functions && time.Since(began) < *duration; k++ {
		if err := pause(ctx, time.Until(began.Add(time.Duration(k)*every))); err != nil {
			break
		}
		if time.Since(began) >= *duration {
			break
		}
		names := make([]string, min(*batch, *functions-counts.created))
		for i := range names {
			names[i] = fmt.Sprintf("%s%d-%d", soakPrefix, runID, counts.created+i)
		}
		if err := counts.runBatch(ctx, fns, firstClient, routerURL, *ns, *pool, names); err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		if time.Since(lastProgress) >= 30*time.Second {
			lastProgress = time.Now()
			fmt.Fprintf(stderr, "soak: %s: %s\n", time.Since(began).Round(time.Second), counts.progress())
		}
	}
	took := time.Since(began)
	stopCallers()
	firstClient.CloseIdleConnections()
	if ctx.Err() != nil {
		fmt.Fprintf(stderr, "soak: interrupted after %s: %s\n", took.Round(time.Second), counts.progress())
		return ctx.Err()
	}

	fmt.Fprintf(stderr, "soak: loop done in %s (%s); settling %s\n", took.Round(time.Second), counts.progress(), *settle)
	if err := pause(ctx, *settle); err != nil {
		return err
	}
	end, err := read(ctx, procs)
	if err != nil {
		return fmt.Errorf("final reading: %w", err)
	}

	fmt.Fprintf(stdout, "soak, %s: %d Functions in batches of %d on pool %s/%s, spread over %s (loop took %s), "+
		"%d callers on %s through %s; each reading the median of %d, %s apart, each after the callers stopped and a %s settle (the first after a warm-up of %d Functions and %s of calls); "+
		"bound ±%.0f%% (goroutines: or ±%d)\n\n",
		time.Now().Format(time.DateOnly), counts.created, *batch, *ns, *pool, *duration, took.Round(time.Second),
		*callers, *function, routerURL, soakReadings, soakReadingGap, *settle, *warmFunctions, soakWarmup,
		soakTolerance*100, soakGoroutineSlack)
	fmt.Fprintln(stdout, "| process | RSS start → end | goroutines start → end | Go heap in use start → end | result |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|")
	failed := 0
	for i, p := range procs {
		ok, verdict := judge(start[i], end[i])
		if !ok {
			failed++
		}
		fmt.Fprintf(stdout, "| %s | %.1f MiB → %.1f MiB (%s) | %.0f → %.0f (%s) | %.1f MiB → %.1f MiB | %s |\n", p.name,
			start[i].rss/(1<<20), end[i].rss/(1<<20), change(start[i].rss, end[i].rss),
			start[i].goroutines, end[i].goroutines, change(start[i].goroutines, end[i].goroutines),
			start[i].heap/(1<<20), end[i].heap/(1<<20), verdict)
	}
	fmt.Fprintln(stdout)
	counts.print(stdout)
	if failed > 0 {
		return fmt.Errorf("soak: %d of %d processes outside the bound", failed, len(procs))
	}
	return nil
}

// runCaller calls function through the router back to back until ctx ends,
// counting the calls and those that do not answer 200.
func (c *soakCounts) runCaller(ctx context.Context, client *http.Client, routerURL, function string) {
	for ctx.Err() == nil {
		_, err := call(ctx, client, routerURL+"/bench", function)
		if ctx.Err() != nil {
			return // cut by the stop, not failed
		}
		c.mu.Lock()
		c.calls++
		if err != nil {
			if c.failures++; c.firstFailure == "" {
				c.firstFailure = oneLine(err.Error())
			}
		}
		c.mu.Unlock()
		if err != nil {
			// A router that refuses at once must not turn the caller
			// into a busy loop on a 2-core machine.
			_ = pause(ctx, 100*time.Millisecond)
		}
	}
}

// runBatch creates the Functions names on pool, calls each once through
// the router (all at once), and deletes them; it returns when the deletes
// are accepted, not when the Functions' instances are gone.
func (c *soakCounts) runBatch(ctx context.Context, fns dynamic.ResourceInterface, client *http.Client,
	routerURL, ns, pool string, names []string) error {
	for _, name := range names {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "Function",
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     map[string]any{"pool": pool, "maxInstances": int64(1), "idleTimeout": "10s"},
		}}
		attempt := 0
		err := retry.OnError(retry.DefaultBackoff, transient, func() error {
			attempt++
			_, err := fns.Create(ctx, obj, metav1.CreateOptions{})
			if attempt > 1 && apierrors.IsAlreadyExists(err) {
				return nil // an earlier attempt got through
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("create Function %s/%s: %w", ns, name, err)
		}
		c.mu.Lock()
		c.created++
		c.mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Go(func() {
			out, err := firstCall(ctx, client, routerURL, ns+"/"+name)
			if ctx.Err() != nil {
				return
			}
			c.mu.Lock()
			c.first[out]++
			if err != nil && c.firstCallErrMsg == "" {
				c.firstCallErrMsg = oneLine(err.Error())
			}
			c.mu.Unlock()
		})
	}
	wg.Wait()
	for _, name := range names {
		err := retry.OnError(retry.DefaultBackoff, transient, func() error {
			err := fns.Delete(ctx, name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("delete Function %s/%s: %w", ns, name, err)
		}
		c.mu.Lock()
		c.deleted++
		c.mu.Unlock()
	}
	return nil
}

// transient says whether an API error is worth another try: the API server
// of a busy 2-core cluster times out now and then.
func transient(err error) bool {
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
}

// firstCall makes a Function's first call through the router and returns
// its outcome: the status code, "503 (Retry-After)" for the router's
// retryable answer (the pool may have no warm pod), or "error" (with err)
// when no answer came.
func firstCall(ctx context.Context, client *http.Client, routerURL, function string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, routerURL+"/soak", nil)
	if err != nil {
		return "error", err
	}
	req.Header.Set("x-skipper-function", function)
	resp, err := client.Do(req)
	if err != nil {
		return "error", err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	out := strconv.Itoa(resp.StatusCode)
	if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" {
		out += " (Retry-After)"
	}
	return out, nil
}

// deleteSoakFunctions deletes every Function of fns named soakPrefix* that
// is not already being deleted, and returns how many it deleted.
func deleteSoakFunctions(ctx context.Context, fns dynamic.ResourceInterface) (int, error) {
	list, err := fns.List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, f := range list.Items {
		if !strings.HasPrefix(f.GetName(), soakPrefix) || f.GetDeletionTimestamp() != nil {
			continue
		}
		if err := fns.Delete(ctx, f.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete Function %s: %w", f.GetName(), err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

func (c *soakCounts) progress() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%d Functions created, %d deleted; callers: %d calls, %d failed", c.created, c.deleted, c.calls, c.failures)
}

// print writes the counts as a markdown list.
func (c *soakCounts) print(w io.Writer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintf(w, "- Functions created: %d, deleted: %d\n", c.created, c.deleted)
	total := 0
	var outs []string
	for _, k := range slices.Sorted(maps.Keys(c.first)) {
		total += c.first[k]
		outs = append(outs, fmt.Sprintf("%s ×%d", k, c.first[k]))
	}
	fmt.Fprintf(w, "- first calls: %d (%s)", total, strings.Join(outs, ", "))
	if c.firstCallErrMsg != "" {
		fmt.Fprintf(w, "; first error: %s", c.firstCallErrMsg)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "- callers' calls: %d, failed (not 200): %d", c.calls, c.failures)
	if c.firstFailure != "" {
		fmt.Fprintf(w, "; first failure: %s", c.firstFailure)
	}
	fmt.Fprintln(w)
}

// oneLine squeezes an error (which may carry a response body) onto one
// short line of the markdown list.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > 200 {
		s = string(r[:200]) + "…"
	}
	return s
}

// pause waits d (nothing when d <= 0) or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
