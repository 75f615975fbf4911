package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/tests/cluster"
)

// ensureWarmFunction creates the bench's Function (one instance, never
// scaled to zero), or keeps one an interrupted run left.
func ensureWarmFunction(ctx context.Context, dyn dynamic.Interface, cfg warmConfig) error {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "Function",
		"metadata": map[string]any{"name": warmFunction, "namespace": cfg.Namespace},
		"spec":     map[string]any{"pool": cfg.Pool, "minInstances": int64(1), "maxInstances": int64(1)},
	}}
	_, err := dyn.Resource(v1alpha1.Resource).Namespace(cfg.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Function %s/%s: %w", cfg.Namespace, warmFunction, err)
	}
	return nil
}

// waitCallable calls function through the router until it answers 200.
func waitCallable(ctx context.Context, url, function string, timeout time.Duration) error {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	for {
		err := get(ctx, c, url, function)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s through %s: not answering 200 within %s: %w", function, url, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// warmInstance returns the bench Function's ready instance as pod IP:port
// (the pod's first container port, which a Function's port defaults to)
// and its node.
func warmInstance(ctx context.Context, cs kubernetes.Interface, ns string) (string, string, error) {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + warmFunction})
	if err != nil {
		return "", "", err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || !ready(p) || p.Status.PodIP == "" ||
			len(p.Spec.Containers) == 0 || len(p.Spec.Containers[0].Ports) == 0 {
			continue
		}
		port := strconv.Itoa(int(p.Spec.Containers[0].Ports[0].ContainerPort))
		return net.JoinHostPort(p.Status.PodIP, port), p.Spec.NodeName, nil
	}
	return "", "", fmt.Errorf("no ready instance of %s/%s with a pod IP and a container port", ns, warmFunction)
}

// nodeRouterPod is the router pod running on node n.
func nodeRouterPod(ctx context.Context, cs kubernetes.Interface, n int) (*corev1.Pod, error) {
	pods, err := cs.CoreV1().Pods("skipper-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=skipper-noderouter",
		FieldSelector: "spec.nodeName=" + cluster.NodeName(n),
	})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && ready(*p) {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no ready router pod on %s", cluster.NodeName(n))
}

// routerGOMAXPROCS reads go_sched_gomaxprocs_threads from the router's
// metrics; this machine's CPU count when it cannot.
func routerGOMAXPROCS(ctx context.Context, metricsURL string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return runtime.NumCPU()
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}
	resp, err := c.Do(req)
	if err != nil {
		return runtime.NumCPU()
	}
	defer resp.Body.Close()
	if v, ok := gaugeValue(resp.Body, "go_sched_gomaxprocs_threads"); ok && v >= 1 {
		return int(v)
	}
	return runtime.NumCPU()
}

// gaugeValue finds an unlabelled sample of name in a Prometheus text page.
func gaugeValue(r io.Reader, name string) (float64, bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}
