package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"skipper.dev/skipper/controller/api/v1alpha1"
	podattach "skipper.dev/skipper/tests/attach"
	"skipper.dev/skipper/tests/cluster"
	"skipper.dev/skipper/tests/linuxhost"
)

// The caller check's cost (issue 16): contenders router-pod and
// router-callers call the bench Function through node 1's router from the
// same pod (a caller pod the bench makes on node 2, its ServiceAccount
// skipper-bench-caller), the same instance answering; router-callers runs
// with spec.callers set on the Function, listing that ServiceAccount
// (set before its runs and removed after them), so the router identifies
// the pod by its address in the caller index on every request.
const (
	benchCaller = "skipper-bench-caller"
	callerNode  = 2
)

// startCallerPod makes the caller pod and its ServiceAccount in ns on
// callerNode and returns the pod's network namespace once it is Ready.
func startCallerPod(ctx context.Context, cs kubernetes.Interface, ns, image string, cleanup *cleanups) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: benchCaller, Namespace: ns}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("ServiceAccount %s/%s: %w", ns, benchCaller, err)
	}
	cleanup.add(func() {
		_ = cs.CoreV1().ServiceAccounts(ns).Delete(context.Background(), benchCaller, metav1.DeleteOptions{})
	})
	pods := cs.CoreV1().Pods(ns)
	if err := pods.Delete(ctx, benchCaller, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err == nil {
		if err := waitGone(ctx, cs, ns, benchCaller, 30*time.Second); err != nil {
			return "", err
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: benchCaller, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      cluster.NodeName(callerNode),
			ServiceAccountName:            benchCaller,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			// Any process will do: the bench's load runs in its network
			// namespace. skipper-echo is the image's own.
			Containers: []corev1.Container{{Name: "caller", Image: image,
				Command: []string{"/skipper-echo"}, Args: []string{"--listen=127.0.0.1:8080"},
				Env: []corev1.EnvVar{{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}}}}},
		},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("caller pod: %w", err)
	}
	cleanup.add(func() {
		_ = pods.Delete(context.Background(), benchCaller, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		p, err := pods.Get(ctx, benchCaller, metav1.GetOptions{})
		if err == nil && ready(*p) && p.Status.PodIP != "" {
			return podattach.PodNetns(p)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("caller pod %s/%s not Ready within 60s (err %v)", ns, benchCaller, err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func waitGone(ctx context.Context, cs kubernetes.Interface, ns, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s/%s still there after %s", ns, name, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// setCallers sets spec.callers on the bench Function fn (on: a list of
// some length, as a Function shared by a few teams has, naming the caller
// pod's ServiceAccount last; off: none) and waits until they are applied:
// node 1's router refuses the host, which is no pod, with them (403) and
// serves it without (200), and the caller pod is served (its instance,
// assigned again with the callers, too).
func setCallers(ctx context.Context, dyn dynamic.Interface, cfg warmConfig, routerURL, netns string, on bool) error {
	callers := any(nil)
	want := http.StatusOK
	if on {
		callers = map[string]any{
			"namespaces":      []any{"team-a", "team-b", "team-c"},
			"serviceAccounts": []any{"team-d/web", "team-e/batch", cfg.Namespace + "/" + benchCaller},
		}
		want = http.StatusForbidden
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"callers": callers}})
	if err != nil {
		return err
	}
	if _, err := dyn.Resource(v1alpha1.Resource).Namespace(cfg.Namespace).Patch(ctx, warmFunction, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("spec.callers of %s/%s: %w", cfg.Namespace, warmFunction, err)
	}
	fn := cfg.Namespace + "/" + warmFunction
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code := 0
		if req, err := http.NewRequestWithContext(ctx, http.MethodGet, routerURL+"/", nil); err == nil {
			req.Header.Set("x-skipper-function", fn)
			if resp, err := c.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
			}
		}
		if code == want {
			return waitCallableIn(ctx, netns, routerURL+"/", fn, 30*time.Second)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("spec.callers %v on %s: the host still gets %d, want %d", on, fn, code, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitCallableIn is waitCallable from the network namespace netns (curl in
// it): a Function with callers answers only its callers.
func waitCallableIn(ctx context.Context, netns, url, function string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		out, err := exec.CommandContext(ctx, "nsenter", "--net="+linuxhost.NetnsPath(netns), "--", "curl", "-sS", "--max-time", "5",
			"-o", "/dev/null", "-w", "%{http_code}", "-H", "x-skipper-function: "+function, url).CombinedOutput()
		code := strings.TrimSpace(string(out))
		if err == nil && code == "200" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s through %s from %s: not answering 200 within %s (%s %v)", function, url, netns, timeout, code, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// callersCost is the caller check's cost: router-callers against
// router-pod, per round (the two run back to back in each), as ratios of
// the router's CPU per request.
type callersCost struct {
	ClosedCPU stat `json:"closed_cpu_ratio"`
	OpenCPU   stat `json:"open_cpu_ratio"`
}

// callersRatios pairs the rounds of with (router-callers) and without
// (router-pod).
func callersRatios(without, with []roundResult) callersCost {
	perReq := func(cpu time.Duration, n int64) float64 {
		if cpu < 0 || n == 0 {
			return math.NaN()
		}
		return float64(cpu) / float64(n)
	}
	var closed, open []float64
	for i := range min(len(without), len(with)) {
		a, b := without[i], with[i]
		closed = append(closed, perReq(b.closedCPU, b.closed.Requests)/perReq(a.closedCPU, a.closed.Requests))
		open = append(open, perReq(b.openCPU, int64(b.open.Total))/perReq(a.openCPU, int64(a.open.Total)))
	}
	return callersCost{ClosedCPU: summarize(closed), OpenCPU: summarize(open)}
}

// callersSection renders the cost as the docs section's part.
func (c callersCost) markdown() string {
	var b strings.Builder
	b.WriteString("\n### The caller check (`spec.callers`)\n\n")
	b.WriteString("Contenders router-pod and router-callers call the bench Function through node 1's router from the same pod on node 2, " +
		"the same instance answering; router-callers runs with the Function's `spec.callers` set to 3 namespaces and 3 ServiceAccounts, " +
		"the caller's last (set before its runs, removed after: the router looks the caller up in its index of the cluster's pods on every request, " +
		"and tells the instance, which checks it too). Ratios of the router's CPU per request, with the check over without, " +
		"per round (the two run back to back), median and range.\n\n")
	b.WriteString("| loop | router CPU / request, callers set ÷ empty | target |\n|---|---|---|\n")
	fmt.Fprintf(&b, "| closed | %s | ≤ 1.05 |\n", fmtStat(c.ClosedCPU, "%.3f", "×"))
	fmt.Fprintf(&b, "| open | %s | ≤ 1.05 |\n", fmtStat(c.OpenCPU, "%.3f", "×"))
	return b.String()
}

var errNoCallerPair = errors.New("router-pod and router-callers run together")
