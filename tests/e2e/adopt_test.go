package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

// createPool creates pool Deployment default/<name>, a copy of the echo
// pool with replicas pods, and deletes it when the test ends.
func createPool(t *testing.T, name string, replicas int32) {
	t.Helper()
	echo, err := env.kube.AppsV1().Deployments("default").Get(t.Context(), "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{v1alpha1.LabelPool: name}}}
	d.Spec = *echo.Spec.DeepCopy()
	d.Spec.Replicas = &replicas
	d.Spec.Selector.MatchLabels = map[string]string{v1alpha1.LabelPool: name}
	d.Spec.Template.Labels = map[string]string{v1alpha1.LabelPool: name}
	if _, err := env.kube.AppsV1().Deployments("default").Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pool %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := env.kube.AppsV1().Deployments("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete pool %s: %v", name, err)
		}
	})
}

// echoed is who answered a call: the pod and the function its instance
// holds, as the instance itself says.
type echoed struct {
	Pod struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"pod"`
	Function string `json:"function"`
}

func callEcho(client *http.Client, function string) (echoed, error) {
	var e echoed
	req, err := http.NewRequest(http.MethodGet, env.routerURL+"/adopt", nil)
	if err != nil {
		return e, err
	}
	req.Header.Set("x-skipper-function", function)
	resp, err := client.Do(req)
	if err != nil {
		return e, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return e, fmt.Errorf("%d: %s", resp.StatusCode, b)
	}
	return e, json.Unmarshal(b, &e)
}

// TestKilledAfterAssignAdopted (issue 15): the owner assigns a pool pod
// and dies before its record can land (kube-apiserver is stopped, so the
// record waits). The instance is the function's all the same; the next
// claim that meets the pod learns so from its 409 and records it for the
// function it holds, and no pod ever serves two functions (checked against
// what each instance says it holds).
func TestKilledAfterAssignAdopted(t *testing.T) {
	sfx := time.Now().UnixNano() % 1e6
	pool := fmt.Sprintf("adopt-%d", sfx)
	f, g := fmt.Sprintf("adopt-f-%d", sfx), fmt.Sprintf("adopt-g-%d", sfx)
	// One warm pod: whoever claims next must meet the unrecorded one.
	createPool(t, pool, 1)
	// Idle long enough not to scale to zero while the pool refills after
	// the outage (up to two minutes, see TestColdStartWhileAPIServerDown).
	createFunction(t, f, map[string]any{"pool": pool, "maxInstances": int64(1), "idleTimeout": "5m"})
	createFunction(t, g, map[string]any{"pool": pool, "maxInstances": int64(1), "idleTimeout": "5m"})
	var owner string
	poll.Until(t, 60*time.Second, pollInterval, "f owned and its pool's pod ready", func(ctx context.Context) error {
		if owner, _ = functionStatus(t, f)["owner"].(string); owner == "" {
			return fmt.Errorf("no owner of %s yet", f)
		}
		pods, err := env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + pool})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if podReady(p) {
				return nil
			}
		}
		return fmt.Errorf("no ready pod in pool %s", pool)
	})
	ownerPod, err := env.kube.CoreV1().Pods("skipper-system").Get(t.Context(), owner, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pid := containerPid(t, ownerPod, "controller")
	fnF, err := env.dyn.Resource(v1alpha1.Resource).Namespace("default").Get(t.Context(), f, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	start := stopAPIServer(t)
	client := &http.Client{Timeout: 10 * time.Second}
	first, err := callEcho(client, "default/"+f)
	if err != nil {
		t.Fatalf("first call of %s: %v", f, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 the owner %s (pid %d): %v", owner, pid, err)
	}
	t.Logf("%s assigned %s to %s; killed it (pid %d) before its record", owner, first.Pod.Name, f, pid)
	start()

	// g's claim meets the unrecorded pod first: the pool has no other.
	var second echoed
	poll.Until(t, 150*time.Second, pollInterval, "g's first call", func(context.Context) error {
		second, err = callEcho(client, "default/"+g)
		return err
	})
	if second.Pod.UID == first.Pod.UID {
		t.Fatalf("%s answered %s too: one pod serves two functions", first.Pod.Name, g)
	}
	poll.Until(t, 30*time.Second, pollInterval, "the killed owner's claim recorded", func(ctx context.Context) error {
		p, err := env.kube.CoreV1().Pods("default").Get(ctx, first.Pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Labels[v1alpha1.LabelFunction] != f || !ownedBy(*p, fnF) {
			return fmt.Errorf("pod %s: labels %v owners %v", p.Name, p.Labels, p.OwnerReferences)
		}
		return nil
	})
	// Every instance holds what its pod says, and only that.
	for fn, want := range map[string]string{f: first.Pod.UID, g: second.Pod.UID} {
		e, err := callEcho(client, "default/"+fn)
		if err != nil {
			t.Fatalf("call %s: %v", fn, err)
		}
		if e.Pod.UID != want || e.Function != "default/"+fn {
			t.Errorf("%s answered by %s holding %q; want %s holding default/%s", fn, e.Pod.Name, e.Function, want, fn)
		}
		// The record follows the assign off the call's path: a call can
		// be served before its pod's label lands.
		poll.Until(t, 30*time.Second, pollInterval, "pod "+e.Pod.Name+" labelled for "+fn, func(ctx context.Context) error {
			p, err := env.kube.CoreV1().Pods("default").Get(ctx, e.Pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got := p.Labels[v1alpha1.LabelFunction]; got != fn {
				return fmt.Errorf("pod %s holds default/%s but is labelled %q", p.Name, fn, got)
			}
			return nil
		})
	}
	// The pool refilled (the kube-controller-manager is past its own
	// reconnect after the outage), and the killed replica is back, before
	// later tests.
	poll.Until(t, 120*time.Second, pollInterval, "pool "+pool+" refilled", func(ctx context.Context) error {
		pods, err := env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + pool + ",!" + v1alpha1.LabelFunction})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if podReady(p) && p.DeletionTimestamp == nil {
				return nil
			}
		}
		return fmt.Errorf("no warm pod in pool %s", pool)
	})
	poll.Until(t, 60*time.Second, pollInterval, "every controller ready again", func(ctx context.Context) error {
		pods, err := env.kube.CoreV1().Pods("skipper-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=skipper-controller"})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if !podReady(p) {
				return fmt.Errorf("%s not ready", p.Name)
			}
		}
		return nil
	})
}
