package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// Issue 13: no input takes Skipper down, and nothing leaks.

// etcdURL is the local cluster's etcd client URL (tests/cluster: plain HTTP
// on the root namespace's loopback). Its JSON gateway (/v3/kv/*) lets a test
// write an object past the API server's validation, as a CRD of an older
// version or a hand-edited etcd would leave it.
const etcdURL = "http://127.0.0.1:2379"

func etcdCall(t *testing.T, path string, req, resp any) {
	t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	r, err := http.Post(etcdURL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("etcd %s: %v", path, err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("etcd %s: %d %s", path, r.StatusCode, body)
	}
	if resp != nil {
		if err := json.Unmarshal(body, resp); err != nil {
			t.Fatalf("etcd %s: %v: %s", path, err, body)
		}
	}
}

// etcdEdit rewrites the stored JSON of the object at key with edit.
func etcdEdit(t *testing.T, key string, edit func(obj map[string]any)) {
	t.Helper()
	k := base64.StdEncoding.EncodeToString([]byte(key))
	var got struct {
		Kvs []struct {
			Value string `json:"value"`
		} `json:"kvs"`
	}
	etcdCall(t, "/v3/kv/range", map[string]string{"key": k}, &got)
	if len(got.Kvs) != 1 {
		t.Fatalf("etcd key %s: %d values", key, len(got.Kvs))
	}
	raw, err := base64.StdEncoding.DecodeString(got.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatalf("etcd key %s does not hold JSON: %v", key, err)
	}
	edit(obj)
	out, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	etcdCall(t, "/v3/kv/put", map[string]string{"key": k, "value": base64.StdEncoding.EncodeToString(out)}, nil)
}

func conditionOf(t *testing.T, name, typ string) map[string]any {
	t.Helper()
	conds, _ := functionStatus(t, name)["conditions"].([]any)
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			return m
		}
	}
	return nil
}

// controllersReady says whether every controller replica is Ready and
// updated, as a poll.Until condition.
func controllersReady(ctx context.Context) error {
	d, err := env.kube.AppsV1().Deployments("skipper-system").Get(ctx, "skipper-controller", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if d.Status.ReadyReplicas != *d.Spec.Replicas || d.Status.UpdatedReplicas != *d.Spec.Replicas {
		return fmt.Errorf("%d ready, %d updated of %d", d.Status.ReadyReplicas, d.Status.UpdatedReplicas, *d.Spec.Replicas)
	}
	return nil
}

// TestFunctionPastValidationDegraded: a Function whose stored spec the
// controllers cannot convert (idleTimeout "5 minutes", written straight to
// etcd) no longer stops them: after a controller restarts (its informers
// list the bad object), all three are Ready, the other Functions are
// served, and the bad one is Degraded.
func TestFunctionPastValidationDegraded(t *testing.T) {
	const bad, good = "past-validation", "past-validation-neighbour"
	createFunction(t, bad, nil)
	etcdEdit(t, "/registry/"+v1alpha1.Group+"/functions/default/"+bad, func(obj map[string]any) {
		obj["spec"].(map[string]any)["idleTimeout"] = "5 minutes"
	})
	fn, err := env.dyn.Resource(v1alpha1.Resource).Namespace("default").Get(t.Context(), bad, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructuredString(fn.Object, "spec", "idleTimeout"); got != "5 minutes" {
		t.Fatalf("the API server serves idleTimeout %q, want the value written to etcd", got)
	}

	pods, err := env.kube.CoreV1().Pods("skipper-system").List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=skipper-controller"})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("controller pods: %v (%d)", err, len(pods.Items))
	}
	victim := pods.Items[0]
	pid := containerPid(t, &victim, "controller")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 controller %s (pid %d): %v", victim.Name, pid, err)
	}
	poll.Until(t, 60*time.Second, 200*time.Millisecond, "the killed controller restarted and Ready", func(context.Context) error {
		p, err := env.kube.CoreV1().Pods("skipper-system").Get(t.Context(), victim.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if restarts(p) <= restarts(&victim) || !podReady(*p) {
			return fmt.Errorf("%d restarts, ready %t", restarts(p), podReady(*p))
		}
		return nil
	})
	poll.Until(t, 90*time.Second, 200*time.Millisecond, "all three controllers Ready after the restart", controllersReady)

	if code, body := call(t, "default/echo", "/after-restart"); code != http.StatusOK {
		t.Fatalf("default/echo after the restart: %d %s", code, body)
	}
	createFunction(t, good, nil)
	firstCall(t, "default/"+good)

	poll.Until(t, 30*time.Second, 200*time.Millisecond, "Function "+bad+" Degraded", func(context.Context) error {
		if c := conditionOf(t, bad, "Degraded"); c == nil || c["status"] != "True" {
			return fmt.Errorf("condition %v", c)
		}
		return nil
	})
	c := conditionOf(t, bad, "Degraded")
	if msg, _ := c["message"].(string); !strings.Contains(msg, "idleTimeout") {
		t.Errorf("Degraded message %q does not name idleTimeout", msg)
	}
	code, body := call(t, "default/"+bad, "/")
	if code == http.StatusOK {
		t.Errorf("the Degraded function answered 200: %s", body)
	}
	t.Logf("calling the Degraded function: %d %s", code, strings.TrimSpace(body))
}

// restarts sums the pod's container restarts.
func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, cs := range p.Status.ContainerStatuses {
		n += cs.RestartCount
	}
	return n
}

func unstructuredString(obj map[string]any, fields ...string) (string, bool, error) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[f]
	}
	s, ok := cur.(string)
	return s, ok, nil
}

// rawCall sends one GET for function through the router on a connection of
// its own and returns it after the response headers, for the caller to read
// part of the body and close.
func rawCall(t *testing.T, function, query string) (net.Conn, *http.Response) {
	t.Helper()
	u, err := url.Parse(env.routerURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatalf("dial router: %v", err)
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "GET /?%s HTTP/1.1\r\nHost: %s\r\nX-Skipper-Function: %s\r\n\r\n", query, u.Host, function)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		conn.Close()
		t.Fatalf("%s ?%s: response headers: %v", function, query, err)
	}
	return conn, resp
}

// TestAbortedResponseFreesSlot: a response broken after its headers, by the
// caller going away or by the instance dropping the connection, frees the
// instance's slot: a concurrencyLimit-1 function answers the next call at
// once.
func TestAbortedResponseFreesSlot(t *testing.T) {
	const fn = "aborted"
	createFunction(t, fn, map[string]any{"concurrencyLimit": int64(1), "maxInstances": int64(1), "idleTimeout": "5m"})
	ref := "default/" + fn
	firstCall(t, ref)
	client := &http.Client{Timeout: 30 * time.Second}
	next := func(after string) {
		t.Helper()
		start := time.Now()
		if _, err := callPod(t, client, ref, ""); err != nil {
			t.Fatalf("call after %s: %v", after, err)
		}
		// The router's cold-start wait for a slot is seconds; a freed slot
		// answers in milliseconds.
		if d := time.Since(start); d > time.Second {
			t.Errorf("call after %s took %s: the slot was not freed", after, d)
		}
	}
	for range 3 {
		conn, resp := rawCall(t, ref, "stall=1m")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stall: %d", resp.StatusCode)
		}
		conn.Close() // the caller leaves mid-body
		next("the caller left mid-body")

		conn, resp = rawCall(t, ref, "cut=1")
		_, err := io.ReadAll(resp.Body)
		conn.Close()
		if err == nil {
			t.Fatal("cut=1: the body arrived whole through the router, want it broken")
		}
		next("the instance dropped the connection mid-body")
	}
}

// TestAbortedOneshotReleased: a oneshot call whose response breaks after its
// headers still releases its instance (the pod is deleted, not left for its
// lease).
func TestAbortedOneshotReleased(t *testing.T) {
	const fn = "oneshot-aborted"
	createFunction(t, fn, map[string]any{"oneshot": true})
	ref := "default/" + fn
	firstCall(t, ref) // callable (a new Function within 2 s), and its pod released as usual
	for _, q := range []string{"cut=1", "stall=1m"} {
		conn, resp := rawCall(t, ref, q)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", q, resp.StatusCode)
		}
		conn.Close()
		poll.Until(t, 15*time.Second, 200*time.Millisecond, "the oneshot instance of the "+q+" call released", func(context.Context) error {
			pods, err := env.kube.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + fn})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil {
					return fmt.Errorf("%s not deleted", p.Name)
				}
			}
			return nil
		})
	}
}

// TestForgedReportChangesNoScale: a report with counts far out of bounds and
// a timestamp a year ahead, sent to the owner on a Connect stream of its
// own, changes no scale: the function keeps its one instance, and the
// violations are counted.
func TestForgedReportChangesNoScale(t *testing.T) {
	const fn = "forged"
	createFunction(t, fn, map[string]any{"scaling": map[string]any{"targetInFlight": int64(1)}, "idleTimeout": "5m"})
	ref := "default/" + fn
	firstCall(t, ref)
	pod := functionOwnerPod(t, fn)
	violations := func() float64 {
		var n float64
		for _, u := range controllerMetricsURLs(t) {
			n += counterSum(t, u, "skipper_controller_wire_violations_total", nil)
		}
		return n
	}
	before := violations()

	// The forger takes node 1's router's name, and a token of it (one
	// stolen, or a router gone wrong: TestHostileCallers covers callers
	// without one), with an incarnation of its own: a future timestamp
	// applied would make the real router's reports look older, and be
	// ignored, for good.
	routers, err := env.kube.CoreV1().Pods("skipper-system").List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=skipper-noderouter"})
	if err != nil || len(routers.Items) == 0 {
		t.Fatalf("router pods: %v (%d)", err, len(routers.Items))
	}
	real := routers.Items[0]
	stream, err := controllerClient(t, pod, podToken(t, &real)).Connect(t.Context())
	if err != nil {
		t.Fatalf("connect to the owner %s: %v", pod.Name, err)
	}
	id := &skipperv1.RouterIdentity{Node: real.Spec.NodeName, Pod: "skipper-system/" + real.Name, Incarnation: "forged-1"}
	if err := stream.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Hello{Hello: &skipperv1.Hello{Router: id}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("the owner's welcome: %v", err)
	}
	future := timestamppb.New(time.Now().Add(365 * 24 * time.Hour))
	for seq := uint64(1); seq <= 3; seq++ {
		err := stream.Send(&skipperv1.RouterMessage{Message: &skipperv1.RouterMessage_Report{Report: &skipperv1.Report{
			Sequence: seq, Time: future,
			Functions: []*skipperv1.FunctionReport{{
				Function: &skipperv1.FunctionRef{Namespace: "default", Name: fn},
				InFlight: math.MaxUint32, Queued: math.MaxUint32, RequestsTotal: math.MaxUint64,
			}},
		}}})
		if err != nil {
			t.Fatalf("send report %d: %v", seq, err)
		}
	}
	poll.Until(t, 10*time.Second, 200*time.Millisecond, "the forged reports counted as violations", func(context.Context) error {
		if v := violations(); v <= before {
			return fmt.Errorf("%v violations, %v before", v, before)
		}
		return nil
	})
	// Ten scale intervals of the local overlay (500ms): a report applied
	// would have scaled to maxInstances 3 within one.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if n := instances(t, fn); n > 1 {
			t.Fatalf("the forged report scaled %s to %d instances", fn, n)
		}
		if d, _ := functionStatus(t, fn)["desired"].(int64); d > 1 {
			t.Fatalf("the forged report set desired %d", d)
		}
		time.Sleep(250 * time.Millisecond) // sleep: poll (nothing may scale for ten scale intervals)
	}
	// The real routers' reports still count: two callers with a request in
	// flight each scale the function to two instances.
	stop := make(chan struct{})
	_, _, wait := load(t, ref, "sleep=300ms", 2, stop)
	defer wait()
	defer close(stop)
	poll.Until(t, 30*time.Second, 200*time.Millisecond, "two instances for two callers after the forged reports", func(context.Context) error {
		if n := instances(t, fn); n < 2 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
}
