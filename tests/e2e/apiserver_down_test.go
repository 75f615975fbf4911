package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/ring"
	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/tests/cluster"
)

// unclaimedReady counts the echo pool's Ready pods no function holds.
func unclaimedReady(ctx context.Context) (int, error) {
	pods, err := env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{
		LabelSelector: v1alpha1.LabelPool + "=echo,!" + v1alpha1.LabelFunction})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && podReady(p) {
			n++
		}
	}
	return n, nil
}

// controllerMetricsURLs are the ready controllers' metrics URLs, listed
// now: the env file's CONTROLLER_METRICS_URLS are those of make up's
// replicas, and a controller an earlier test killed comes back at another
// address when its cluster is re-used.
func controllerMetricsURLs(t *testing.T) []string {
	t.Helper()
	pods, err := env.kube.CoreV1().Pods("skipper-system").List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=skipper-controller"})
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && podReady(p) {
			urls = append(urls, "http://"+p.Status.PodIP+":9091/metrics")
		}
	}
	return urls
}

// unrecorded sums skipper_controller_claims_unrecorded over the
// controllers at urls.
func unrecorded(t *testing.T, urls []string) float64 {
	t.Helper()
	sum := 0.0
	for _, u := range urls {
		sum += metricSum(t, u, "skipper_controller_claims_unrecorded", nil)
	}
	return sum
}

// stopAPIServer stops the cluster's kube-apiserver and returns start,
// which starts it again and waits until it is ready; start is idempotent
// and also runs when the test ends.
func stopAPIServer(t *testing.T) (start func()) {
	t.Helper()
	stateDir := filepath.Join(env.root, ".skipper")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := cluster.Control(ctx, stateDir, "stop", "kube-apiserver"); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var once sync.Once
	start = func() {
		once.Do(func() {
			// Its own context: the cleanup runs after the test's ended.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := cluster.Control(ctx, stateDir, "start", "kube-apiserver"); err != nil && !strings.Contains(err.Error(), "not stopped") {
				t.Errorf("start kube-apiserver: %v", err)
				return
			}
			t.Logf("kube-apiserver down for %s", time.Since(stopped).Round(time.Millisecond))
			waitRecovered(t)
		})
	}
	t.Cleanup(start)
	return start
}

// waitRecovered waits until the cluster has recovered from an API server
// outage as far as the next test needs: a Function created now, one owned
// by each controller replica, is callable. The controllers reach the API
// server through the kubernetes Service, whose endpoint the stopping API
// server withdrew and kube-proxy must restore (its own watch backs off:
// 5-20 s here); each replica's watches resume within a second of that
// (internal/kubedial), and until then its cache may miss new Functions and
// list pool pods that are gone. Later tests give a new Function seconds,
// not that.
func waitRecovered(t *testing.T) {
	t.Helper()
	fns := env.dyn.Resource(v1alpha1.Resource).Namespace("default")
	began := time.Now()
	var names []string
	poll.Until(t, 2*time.Minute, pollInterval, "a Function for each controller replica", func(ctx context.Context) error {
		list, err := env.kube.DiscoveryV1().EndpointSlices("skipper-system").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=skipper-controller"})
		if err != nil {
			return err
		}
		var eps []*discoveryv1.EndpointSlice
		for i := range list.Items {
			eps = append(eps, &list.Items[i])
		}
		members := ring.MembersFromEndpointSlices(eps, ring.PortName)
		r, err := ring.New(members)
		if err != nil || len(members) == 0 {
			return fmt.Errorf("controller ring of %v: %v", members, err)
		}
		names = names[:0]
		base := time.Now().UnixNano() % 100000
		for _, m := range members {
			for i := range 1000 {
				name := fmt.Sprintf("e2e-recovered-%d-%d", base, i)
				if r.Owner("default/"+name) == m {
					names = append(names, name)
					break
				}
			}
		}
		return nil
	})
	for _, name := range names {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "Function",
			"metadata": map[string]any{"name": name, "namespace": "default"},
			"spec":     map[string]any{"pool": "echo", "maxInstances": int64(1)},
		}}
		poll.Until(t, 2*time.Minute, pollInterval, "Function "+name+", created after the outage, callable", func(ctx context.Context) error {
			if _, err := fns.Get(ctx, name, metav1.GetOptions{}); err != nil {
				if _, err := fns.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
					return fmt.Errorf("create Function %s: %w", name, err)
				}
			}
			_, err := callPod(t, &http.Client{Timeout: 10 * time.Second}, "default/"+name, "")
			return err
		})
	}
	t.Logf("a new Function of each of %d controller replicas callable %s after the API server was back", len(names), time.Since(began).Round(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range names {
		if err := fns.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete Function %s: %v", name, err)
		}
	}
}

// TestColdStartWhileAPIServerDown (issue 15): the instance decides a claim
// and the record follows, so a warm pool serves a new Function's first call
// with kube-apiserver stopped; once it is back, the pod carries the
// function's label and ownerReference and the pool refills.
func TestColdStartWhileAPIServerDown(t *testing.T) {
	name := fmt.Sprintf("apidown-%d", time.Now().UnixNano()%1e6)
	// Idle for longer than the test can take: the instance the record is
	// checked on must not be drained first.
	createFunction(t, name, map[string]any{"maxInstances": int64(1), "idleTimeout": "10m"})
	created := time.Now()
	// The owner has cached the Function (it writes its status), and the
	// pool has a warm pod to give.
	poll.Until(t, 20*time.Second, pollInterval, "the Function owned and a warm pool pod ready", func(ctx context.Context) error {
		if owner, _ := functionStatus(t, name)["owner"].(string); owner == "" {
			return errors.New("no owner in status yet")
		}
		if n, err := unclaimedReady(ctx); err != nil || n == 0 {
			return fmt.Errorf("%d unclaimed ready pool pods (%v)", n, err)
		}
		return nil
	})
	pool, err := env.kube.AppsV1().Deployments("default").Get(context.Background(), "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fn, err := env.dyn.Resource(v1alpha1.Resource).Namespace("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t.Logf("owned and a warm pod ready after %s", time.Since(created).Round(time.Millisecond))
	ctls := controllerMetricsURLs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := stopAPIServer(t)
	stopped := time.Now()
	if _, err := env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{Limit: 1}); err == nil {
		t.Fatal("kube-apiserver still answers after the stop")
	}

	client := &http.Client{Timeout: 10 * time.Second}
	uid, err := callPod(t, client, "default/"+name, "")
	if err != nil {
		t.Fatalf("first call with kube-apiserver down: %v", err)
	}
	if n := unrecorded(t, ctls); n < 1 {
		t.Errorf("skipper_controller_claims_unrecorded sums to %v with kube-apiserver down, want at least 1", n)
	}
	if again, err := callPod(t, client, "default/"+name, ""); err != nil || again != uid {
		t.Errorf("second call: pod %s, %v; want the same pod %s", again, err, uid)
	}
	start()

	// The owner's record retries every 5 s at most, but an owner whose
	// connection to the API server came back last (see waitRecovered) may
	// take a minute more.
	poll.Until(t, 90*time.Second, pollInterval, "the claim recorded on the pod", func(ctx context.Context) error {
		pods, err := env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + name})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if string(p.UID) == uid {
				if !ownedBy(p, fn) {
					return fmt.Errorf("pod %s labelled but not owned by the Function: %v", p.Name, p.OwnerReferences)
				}
				return nil
			}
		}
		return fmt.Errorf("pod %s not labelled for %s yet", uid, name)
	})
	t.Logf("recorded %s after the stop", time.Since(stopped).Round(time.Millisecond))
	poll.Until(t, 15*time.Second, pollInterval, "no claim left unrecorded", func(context.Context) error {
		if n := unrecorded(t, ctls); n != 0 {
			return fmt.Errorf("%v unrecorded", n)
		}
		return nil
	})
	want := int(*pool.Spec.Replicas)
	// The kube-controller-manager's ReplicaSet controller makes the
	// replacement once its own watches are back (seconds; longer right
	// after another outage, when client-go backs off).
	poll.Until(t, 120*time.Second, pollInterval, "the pool refilled", func(ctx context.Context) error {
		n, err := unclaimedReady(ctx)
		if err != nil {
			return err
		}
		if n < want {
			return fmt.Errorf("%d of %d warm pool pods ready", n, want)
		}
		return nil
	})
	t.Logf("pool refilled %s after the stop", time.Since(stopped).Round(time.Millisecond))
	// Nodes stayed Ready through the outage.
	nodes, err := env.kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
				t.Errorf("node %s not Ready after the outage: %s", n.Name, c.Message)
			}
		}
	}
}
