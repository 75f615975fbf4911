package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

// agentPool is deploy/examples/agent/pool.yaml (an image that knows
// nothing of Skipper beside skipper-agent as a native sidecar) named name,
// with the cluster's Skipper image for the agent and the test pod's HTTP
// server on :8080 as the application.
func agentPool(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	b, err := os.ReadFile("../../deploy/examples/agent/pool.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(b, &d); err != nil {
		t.Fatalf("deploy/examples/agent/pool.yaml: %v", err)
	}
	d.Name = name
	labels := map[string]string{v1alpha1.LabelPool: name}
	d.Labels, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels = labels, labels, labels
	spec := &d.Spec.Template.Spec
	if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
		t.Fatalf("the example pool has %d init containers and %d containers, want the agent and the application", len(spec.InitContainers), len(spec.Containers))
	}
	spec.InitContainers[0].Image = env.image
	app := testPodContainer("app", "serve", ":8080")
	spec.Containers[0].Image, spec.Containers[0].Args = app.Image, app.Args
	spec.TerminationGracePeriodSeconds = ptr.To(int64(1))
	return &d
}

// TestAgentServesAPlainImage: a Function on a pool of a plain image with
// skipper-agent beside it is claimed through the agent, and its calls go
// to the application, which finds the assignment the agent handed over in
// the shared directory.
func TestAgentServesAPlainImage(t *testing.T) {
	const pool, fn = "plain", "plain-app"
	deps := env.kube.AppsV1().Deployments("default")
	_ = deps.Delete(t.Context(), pool, metav1.DeleteOptions{})
	poll.Until(t, 30*time.Second, pollInterval, "pool "+pool+" created", func(ctx context.Context) error {
		_, err := deps.Create(ctx, agentPool(t, pool), metav1.CreateOptions{})
		return err
	})
	t.Cleanup(func() { _ = deps.Delete(context.Background(), pool, metav1.DeleteOptions{}) })
	createFunction(t, fn, map[string]any{"pool": pool, "config": map[string]any{"greeting": "hello from the agent"}})

	client := &http.Client{Timeout: 30 * time.Second}
	get := func(ctx context.Context, path string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, env.routerURL+path, nil)
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("x-skipper-function", "default/"+fn)
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	// The pool's pods become ready (image pulls, the agent's start) before
	// the first call can claim one.
	var body string
	poll.Until(t, 120*time.Second, pollInterval, "a call through the agent's instance", func(ctx context.Context) error {
		code, b, err := get(ctx, "/file?path=/var/run/skipper/assignment/function")
		if err != nil {
			return err
		}
		body = b
		return poll.Unmet(code == http.StatusOK, "%d %s", code, b)
	})
	if strings.TrimSpace(body) != "default/"+fn {
		t.Errorf("the application read %q as its function, want default/%s", body, fn)
	}
	code, cfg, err := get(t.Context(), "/file?path=/var/run/skipper/assignment/config.json")
	if err != nil || code != http.StatusOK || !strings.Contains(cfg, "hello from the agent") {
		t.Errorf("config.json through the router: %d %q %v", code, cfg, err)
	}
	// The claim's record (the function's label on the pod) follows the
	// instance's acceptance, in the background.
	var pods *corev1.PodList
	poll.Until(t, 30*time.Second, pollInterval, "the claim recorded", func(ctx context.Context) (err error) {
		pods, err = env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + fn})
		if err != nil {
			return err
		}
		return poll.Unmet(len(pods.Items) > 0, "no pod labelled for %s yet", fn)
	})
	for _, p := range pods.Items {
		if p.Labels[v1alpha1.LabelPool] != pool {
			t.Errorf("instance %s is not the pool's: %v", p.Name, p.Labels)
		}
	}
}

// TestAgentInjected: a Deployment of a plain image with only the pool
// label gets skipper-agent at admission (the MutatingAdmissionPolicy
// skipper-agent: the sidecar, the assign key, the shared directory) and
// serves a Function; a pool that serves the contract itself (the echo
// pool, annotated skipper.dev/contract: self) gets none.
func TestAgentInjected(t *testing.T) {
	const pool, fn = "injected", "injected-app"
	app := testPodContainer("app", "serve", ":8080")
	app.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	app.ReadinessProbe = &corev1.Probe{PeriodSeconds: 1,
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}}
	labels := map[string]string{v1alpha1.LabelPool: pool}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: pool, Namespace: "default", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: labels,
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: v1alpha1.LabelFunction, Operator: metav1.LabelSelectorOpDoesNotExist}}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{AutomountServiceAccountToken: ptr.To(false), TerminationGracePeriodSeconds: ptr.To(int64(1)),
					Containers: []corev1.Container{app}},
			},
		},
	}
	deps := env.kube.AppsV1().Deployments("default")
	_ = deps.Delete(t.Context(), pool, metav1.DeleteOptions{})
	poll.Until(t, 30*time.Second, pollInterval, "pool "+pool+" created", func(ctx context.Context) error {
		_, err := deps.Create(ctx, d, metav1.CreateOptions{})
		return err
	})
	t.Cleanup(func() { _ = deps.Delete(context.Background(), pool, metav1.DeleteOptions{}) })
	createFunction(t, fn, map[string]any{"pool": pool})

	client := &http.Client{Timeout: 30 * time.Second}
	poll.Until(t, 120*time.Second, pollInterval, "a call to the injected pool's instance", func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, env.routerURL+"/file?path=/var/run/skipper/assignment/function", nil)
		if err != nil {
			return err
		}
		req.Header.Set("x-skipper-function", "default/"+fn)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return poll.Unmet(resp.StatusCode == http.StatusOK && strings.TrimSpace(string(b)) == "default/"+fn, "%d %s", resp.StatusCode, b)
	})
	pods, err := env.kube.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + pool})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the pool's pods: %v", err)
	}
	for _, p := range pods.Items {
		if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Name != "skipper-agent" || p.Spec.InitContainers[0].Image != env.image {
			t.Errorf("pod %s was not given the agent (image %s): %+v", p.Name, env.image, p.Spec.InitContainers)
		}
	}
	echo, err := env.kube.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=echo"})
	if err != nil || len(echo.Items) == 0 {
		t.Fatalf("the echo pool's pods: %v", err)
	}
	for _, p := range echo.Items {
		if len(p.Spec.InitContainers) != 0 {
			t.Errorf("echo pod %s, which serves the contract itself, was given %+v", p.Name, p.Spec.InitContainers)
		}
	}
}
