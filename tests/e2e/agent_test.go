package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

// agentPool is a pool of an image that knows nothing of Skipper (the test
// pod's HTTP server on :8080) beside skipper-agent as a native sidecar
// serving the contract on its port named skipper-assign, the assignment
// handed over in a shared emptyDir: what the admission policy will add
// to a labelled Deployment, written here by hand.
func agentPool(name string) *appsv1.Deployment {
	assignment := corev1.VolumeMount{Name: "assignment", MountPath: "/var/run/skipper/assignment"}
	downward := []corev1.EnvVar{
		{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
	}
	app := testPodContainer("app", "serve", ":8080")
	app.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	app.ReadinessProbe = &corev1.Probe{PeriodSeconds: 1,
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}}
	app.VolumeMounts = []corev1.VolumeMount{assignment}
	labels := map[string]string{v1alpha1.LabelPool: name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: labels,
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: v1alpha1.LabelFunction, Operator: metav1.LabelSelectorOpDoesNotExist}}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					AutomountServiceAccountToken:  ptr.To(false),
					TerminationGracePeriodSeconds: ptr.To(int64(1)),
					InitContainers: []corev1.Container{{
						Name: "skipper-agent", Image: env.image, Command: []string{"/skipper-agent"},
						RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
						Env:           downward,
						Ports:         []corev1.ContainerPort{{Name: v1alpha1.AssignPortName, ContainerPort: 7070}},
						// The application starts once the agent serves.
						StartupProbe: &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 30,
							ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString(v1alpha1.AssignPortName)}}},
						VolumeMounts: []corev1.VolumeMount{assignment,
							{Name: "assign-key", MountPath: "/var/run/skipper/assign-key", ReadOnly: true}},
					}},
					Containers: []corev1.Container{app},
					Volumes: []corev1.Volume{
						{Name: "assignment", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "assign-key", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: v1alpha1.AssignKeyConfigMap}}}},
					},
				},
			},
		},
	}
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
		_, err := deps.Create(ctx, agentPool(pool), metav1.CreateOptions{})
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
	pods, err := env.kube.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + fn})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the function's instances: %v, %v", pods, err)
	}
	for _, p := range pods.Items {
		if p.Labels[v1alpha1.LabelPool] != pool {
			t.Errorf("instance %s is not the pool's: %v", p.Name, p.Labels)
		}
	}
}
