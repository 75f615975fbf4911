package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"skipper.dev/skipper/internal/poll"
)

// TestSidecarRouter: deploy/sidecar's caller pod (through
// deploy/overlays/local-sidecar: the image from the cluster's registry) runs the router as a
// sidecar (--mode=sidecar); its application reaches the echo function on
// 127.0.0.1:8380 of its own pod, through a router that is not the node's.
func TestSidecarRouter(t *testing.T) {
	dir := filepath.Join(env.root, "deploy", "overlays", "local-sidecar")
	kubectl(t, nil, "apply", "--server-side", "--field-manager=skipper-e2e", "-k", dir)
	t.Cleanup(func() { kubectl(t, nil, "delete", "--ignore-not-found", "--wait=false", "-k", dir) })

	var pod *corev1.Pod
	poll.Until(t, 2*time.Minute, pollInterval, "the caller pod running with both containers", func(ctx context.Context) error {
		pods, err := env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=caller"})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			running := 0
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Running != nil {
					running++
				}
			}
			if p.DeletionTimestamp == nil && running == 2 {
				pod = p
				return nil
			}
		}
		return fmt.Errorf("%d caller pods, none with both containers running", len(pods.Items))
	})
	app := containerPid(t, pod, "app")
	var body string
	poll.Until(t, time.Minute, pollInterval, "the echo function through the sidecar on 127.0.0.1:8380", func(context.Context) error {
		code, b, err := curlFrom(app, "http://127.0.0.1:8380/sidecar", "x-skipper-function: default/echo")
		if err != nil {
			return err
		}
		if code != 200 {
			return fmt.Errorf("%d: %s", code, b)
		}
		body = b
		return nil
	})
	if !strings.Contains(body, `"function":"default/echo"`) {
		t.Errorf("answer through the sidecar is not the echo function's: %s", body)
	}
	// The kubelet's probes reach the sidecar's admin port on the pod IP:
	// the pod turns Ready only through its readiness probe.
	poll.Until(t, time.Minute, pollInterval, "the caller pod Ready (the sidecar's readiness probe on the pod IP)", func(ctx context.Context) error {
		p, err := env.kube.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !podReady(*p) {
			return fmt.Errorf("pod %s not Ready", p.Name)
		}
		pod = p
		return nil
	})
	// The sidecar's metrics, on the pod IP: it served the call.
	code, metrics, err := curlFrom(app, "http://"+pod.Status.PodIP+":8381/metrics")
	if err != nil || code != 200 {
		t.Fatalf("sidecar metrics: %d, %v", code, err)
	}
	if !strings.Contains(metrics, `skipper_noderouter_requests_total{code="200",function="default/echo"`) {
		t.Errorf("the sidecar's metrics show no 200 for default/echo")
	}
}
