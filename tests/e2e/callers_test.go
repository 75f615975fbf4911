package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/cmd/skipper-echo/echo"
	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

// callerAnswer is a router's JSON error body.
type callerAnswer struct {
	Error, Reason, Function string
}

// TestCallersRefused (issue 16 item 3): a Function that lists its callers
// serves a pod of a listed ServiceAccount, on either node; a pod of
// another gets 403 caller_denied, and a caller that is no pod (the host)
// 403 caller_unknown, before anything is claimed: no instance, desired
// 0, status unchanged. Each refusal is counted by the router.
func TestCallersRefused(t *testing.T) {
	ctx := context.Background()
	const fn = "e2e-callers"
	sas := env.kube.CoreV1().ServiceAccounts("default")
	for _, name := range []string{"e2e-allowed", "e2e-other"} {
		if _, err := sas.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create ServiceAccount %s: %v", name, err)
		}
		t.Cleanup(func() { _ = sas.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	as := func(p *corev1.Pod, sa string) *corev1.Pod { p.Spec.ServiceAccountName = sa; return p }
	pods := createPods(t,
		as(echoPod("e2e-callers-allowed", "node2", nil), "e2e-allowed"),
		as(echoPod("e2e-callers-other", "node1", nil), "e2e-other"),
	)
	allowed := containerPid(t, pods["e2e-callers-allowed"], "echo")
	other := containerPid(t, pods["e2e-callers-other"], "echo")
	createFunction(t, fn, map[string]any{"callers": map[string]any{"serviceAccounts": []any{"default/e2e-allowed"}}})
	router1Metrics := routerMetricsURL(1)
	refused := func(reason string) float64 {
		return counterSum(t, router1Metrics, "skipper_noderouter_rejected_total", map[string]string{"reason": reason})
	}

	// The node-local address keeps the caller's own source address.
	callFrom := func(pid int, function string) (int, string) {
		t.Helper()
		code, body, err := curlFrom(pid, "http://169.254.20.20/callers", "x-skipper-function: default/"+function)
		if err != nil {
			t.Fatal(err)
		}
		return code, body
	}
	wantRefused := func(code int, body, reason string) {
		t.Helper()
		var a callerAnswer
		if code != http.StatusForbidden || json.Unmarshal([]byte(body), &a) != nil || a.Reason != reason || a.Function != "default/"+fn {
			t.Fatalf("got %d %s, want 403 %s", code, body, reason)
		}
		t.Logf("%s: %s", reason, a.Error)
	}

	// The Function is new: the router's first GetInstance goes to the
	// owner, which refuses before it claims. Within the 2 s a new Function
	// has to become callable. The router names the caller from its pod
	// index, which learns a new pod from its watch: caller_unknown until
	// then (after an API server outage, its watch comes back only after
	// client-go's backoff), so that too is waited out, within 30 s.
	var code int
	var body string
	poll.Until(t, 5*time.Second, pollInterval, "the owner knows the Function", func(context.Context) error {
		if code, body = callFrom(other, fn); code == http.StatusNotFound {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	poll.Until(t, 30*time.Second, pollInterval, "the router knows the caller pod", func(context.Context) error {
		if strings.Contains(body, `"caller_unknown"`) {
			code, body = callFrom(other, fn)
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	wantRefused(code, body, "caller_denied")
	// Counted from here: the waits above may have been refused any number
	// of times.
	deniedBefore, unknownBefore := refused("caller_denied"), refused("caller_unknown")

	// Not a pod: the host calls node 1's router on its node IP.
	req, _ := http.NewRequestWithContext(ctx, "GET", env.routerURL+"/callers", nil)
	req.Header.Set("x-skipper-function", "default/"+fn)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantRefused(resp.StatusCode, string(b), "caller_unknown")

	// Nothing was claimed, nothing scaled.
	if n := instances(t, fn); n != 0 {
		t.Errorf("%d instances after refused calls only, want 0", n)
	}
	if st := functionStatus(t, fn); st["desired"] != nil && st["desired"] != int64(0) {
		t.Errorf("status.desired = %v after refused calls only, want 0", st["desired"])
	}

	// The listed ServiceAccount's pod, on node 2, is served by node 1's
	// router too: the index holds every node's pods. Each router learns
	// the pod from its own watch: caller_unknown until then (counted, for
	// the sum below), waited out as above.
	servedAllowed := func(router string, call func() (int, string, error)) (unknown float64) {
		t.Helper()
		poll.Until(t, 30*time.Second, pollInterval, router+" serves the allowed caller", func(context.Context) error {
			code, body, err := call()
			if err != nil {
				return err
			}
			var got echo.Response
			switch {
			case code == http.StatusForbidden && strings.Contains(body, `"caller_unknown"`):
				unknown++
				return fmt.Errorf("%d %s", code, body)
			case code != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil || got.Function != "default/"+fn:
				t.Fatalf("allowed caller through %s: %d %s", router, code, body)
			}
			return nil
		})
		return unknown
	}
	unknownWaited := servedAllowed("node 1's router", func() (int, string, error) {
		return curlFrom(allowed, env.routerURL+"/callers", "x-skipper-function: default/"+fn)
	})
	// And through its own node's.
	servedAllowed("node 2's router", func() (int, string, error) {
		code, body := callFrom(allowed, fn)
		return code, body, nil
	})
	getInstances := func() float64 {
		return counterSum(t, router1Metrics, "skipper_noderouter_get_instance_total", map[string]string{"result": "caller_refused"})
	}
	asked := getInstances()
	// Node 1's router now holds the function's instances: it refuses the
	// other pod itself, without asking.
	code, body = callFrom(other, fn)
	wantRefused(code, body, "caller_denied")
	if n := getInstances(); n != asked {
		t.Errorf("get_instance_total{caller_refused} went from %v to %v: a cached function's refusal asked the owner", asked, n)
	}
	if code, body = callFrom(other, "echo"); code != http.StatusOK {
		t.Errorf("the refused pod calling default/echo, which lists no callers: %d %s", code, body)
	}
	// The record (the pod's label) lands after the call that claimed it.
	poll.Until(t, 10*time.Second, pollInterval, "one instance after the served calls", func(context.Context) error {
		if n := instances(t, fn); n != 1 {
			return fmt.Errorf("%d instances, want 1", n)
		}
		return nil
	})

	// The instance checks too: a call that goes around the routers to the
	// pod itself, saying nobody, is refused by the instance.
	inst, err := env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "skipper.dev/function=" + fn})
	if err != nil || len(inst.Items) != 1 {
		t.Fatalf("the instance: %v %v", inst, err)
	}
	code, body, err = curlFrom(other, "http://"+inst.Items[0].Status.PodIP+":8080/direct")
	if err != nil {
		t.Fatal(err)
	}
	var direct callerAnswer
	if code != http.StatusForbidden || json.Unmarshal([]byte(body), &direct) != nil || direct.Reason != "caller_unknown" {
		t.Errorf("direct call to the instance: %d %s, want 403 caller_unknown", code, body)
	}

	// Counted before the callers change: calls made while the new callers
	// travel to the routers may be refused once more.
	if d, u := refused("caller_denied")-deniedBefore, refused("caller_unknown")-unknownBefore-unknownWaited; d != 1 || u != 1 {
		t.Errorf("node 1's rejected_total grew by caller_denied %v, caller_unknown %v; want 1 and 1", d, u)
	}

	// The callers change to take the other ServiceAccount too: the routers
	// get the new callers, the owner assigns the instance again with them,
	// and the other pod is served, by the same instance.
	fns := env.dyn.Resource(v1alpha1.Resource).Namespace("default")
	patch := []byte(`{"spec":{"callers":{"serviceAccounts":["default/e2e-allowed","default/e2e-other"]}}}`)
	if _, err := fns.Patch(ctx, fn, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, pollInterval, "the other pod served once the callers list it", func(context.Context) error {
		if code, body := callFrom(other, fn); code != http.StatusOK {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	if n := instances(t, fn); n != 1 {
		t.Errorf("%d instances after the callers changed, want the same 1", n)
	}
}
