package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// runPodStart is `skipper-bench podstart`: how long the cluster takes to
// start a pool pod, as a pool scale-up does. It copies the pool
// Deployment's pod template (image, probes, volumes) into bare pods that no
// ReplicaSet or controller adopts (the pool and function labels dropped),
// creates them -parallel at a time, and times each from the create call to
// the first watch event that shows it Ready: scheduling, sandbox, CNI,
// image, container start and the first readiness probe. It prints
// p50/p90/p99/max and deletes the pods.
func runPodStart(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("podstart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 30, "number of pods, each created once")
	parallel := fs.Int("parallel", 1, "pods created at once (1: each on an otherwise idle cluster)")
	pool := fs.String("pool", "echo", "pool Deployment whose pod template the pods copy")
	ns := fs.String("namespace", "default", "namespace of the pool and the pods")
	envFile := fs.String("env", ".skipper/env", "the local cluster's env file")
	timeout := fs.Duration("timeout", 2*time.Minute, "bound on each pod's wait for Ready")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 || *parallel < 1 {
		return fmt.Errorf("-n and -parallel must be at least 1, got %d and %d", *n, *parallel)
	}
	_, _, cs, err := attach(*envFile)
	if err != nil {
		return err
	}
	d, err := cs.AppsV1().Deployments(*ns).Get(ctx, *pool, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("pool %s/%s: %w", *ns, *pool, err)
	}
	tmpl := d.Spec.Template.DeepCopy()
	run := fmt.Sprintf("podstart-%d", time.Now().Unix()%100000)
	labels := map[string]string{"skipper.dev/bench": run}
	var (
		mu    sync.Mutex
		times []time.Duration
		errs  []error
	)
	sem := make(chan struct{}, *parallel)
	var wg sync.WaitGroup
	for i := range *n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", run, i), Namespace: *ns, Labels: labels},
				Spec:       *tmpl.Spec.DeepCopy(),
			}
			p.Spec.TerminationGracePeriodSeconds = ptr.To(int64(1))
			took, err := startPod(ctx, cs, p, *timeout, *parallel == 1)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			times = append(times, took)
		})
		if *parallel == 1 {
			wg.Wait() // the next pod after the previous one is gone
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d pods did not become Ready: %w", len(errs), *n, errs[0])
	}
	fmt.Fprintf(stdout, "podstart: %d pods from pool %s/%s's template, %d at a time\n", *n, *ns, *pool, *parallel)
	fmt.Fprintf(stdout, "  created -> Ready: %s\n", summary(times))
	return nil
}

// startPod creates p and returns the time from the create call to the
// first watch event showing it Ready. It deletes p before it returns and,
// if waitGone, waits for the deletion (within timeout).
func startPod(ctx context.Context, cs kubernetes.Interface, p *corev1.Pod, timeout time.Duration, waitGone bool) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	api := cs.CoreV1().Pods(p.Namespace)
	w, err := api.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + p.Name})
	if err != nil {
		return 0, fmt.Errorf("watch pod %s: %w", p.Name, err)
	}
	defer w.Stop()
	start := time.Now()
	if _, err := api.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return 0, fmt.Errorf("create pod %s: %w", p.Name, err)
	}
	defer func() {
		_ = api.Delete(context.WithoutCancel(ctx), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		for waitGone {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok || ev.Type == watch.Deleted {
					return
				}
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("pod %s: not Ready after %s", p.Name, timeout)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return 0, fmt.Errorf("pod %s: watch ended", p.Name)
			}
			if ev.Type == watch.Error {
				return 0, fmt.Errorf("pod %s: watch error %v", p.Name, ev.Object)
			}
			if got, ok := ev.Object.(*corev1.Pod); ok && v1alpha1.PodReady(got) {
				return time.Since(start), nil
			}
		}
	}
}
