package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
)

// httpbinCall sends method path to Function default/httpbin through node
// 1's router (the root namespace's way in: the header names the
// function) and returns the answer, its body unread.
func httpbinCall(ctx context.Context, t *testing.T, method, path string, body io.Reader) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, env.routerURL+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("x-skipper-function", "default/httpbin")
	return http.DefaultClient.Do(req)
}

// TestHTTPBinServesAsAFunction (issue 33 item 6): go-httpbin, a
// third-party image built unchanged from its module (make httpbin), in a
// pool that is only a Deployment with the pool label (deploy/examples/
// protocols, applied by make up), got the agent at admission and serves
// Function default/httpbin: by its Service's name from a pod on node 2,
// and through node 1's router from the root namespace, with go-httpbin's
// own answers (status codes, chunked streams, request bodies).
func TestHTTPBinServesAsAFunction(t *testing.T) {
	pods, err := env.kube.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=httpbin"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatal("no pod of pool httpbin (make up applies deploy/examples/protocols)")
	}
	for _, p := range pods.Items {
		if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Name != "skipper-agent" {
			t.Errorf("pod %s's init containers %v: want the agent the admission policy adds", p.Name, p.Spec.InitContainers)
		}
	}

	// The first call claims the warm pod (it may still be starting).
	poll.Until(t, 120*time.Second, pollInterval, "httpbin answering through the router", func(ctx context.Context) error {
		resp, err := httpbinCall(ctx, t, http.MethodGet, "/status/418", nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return poll.Unmet(resp.StatusCode == http.StatusTeapot, "status %s", resp.Status)
	})

	got := runTestPod(t, "e2e-httpbin", "node2", testPodContainer("get", "get",
		"http://httpbin.default.svc.cluster.local/get?from=node2", "http://httpbin.default/headers"))
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 2 {
		t.Fatalf("the pod's calls: %q, want two answers", got)
	}
	if !strings.HasPrefix(lines[0], "200 ") || !strings.Contains(lines[0], `"from": [`) || !strings.Contains(lines[0], `"node2"`) {
		t.Errorf("GET /get by name: %q, want go-httpbin's echo of the query", lines[0])
	}
	if !strings.HasPrefix(lines[1], "200 ") || !strings.Contains(lines[1], `"httpbin.default"`) {
		t.Errorf("GET /headers by name: %q, want go-httpbin's echo with Host httpbin.default", lines[1])
	}

	// A chunked stream of JSON lines, whole and in order.
	resp, err := httpbinCall(t.Context(), t, http.MethodGet, "/stream/5", nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); n++ {
		if !strings.Contains(sc.Text(), `"id":`) && !strings.Contains(sc.Text(), `"id": `) {
			t.Errorf("line %d of /stream/5: %q", n, sc.Text())
		}
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(resp.TransferEncoding) == 0 || n != 5 {
		t.Errorf("/stream/5: %s, transfer encoding %v, %d lines; want 200, chunked, 5", resp.Status, resp.TransferEncoding, n)
	}

	// A request body, whose length go-httpbin saw.
	const size = 1 << 20
	resp, err = httpbinCall(t.Context(), t, http.MethodPost, "/anything", strings.NewReader(strings.Repeat("x", size)))
	if err != nil {
		t.Fatal(err)
	}
	var echoed struct {
		Headers map[string][]string `json:"headers"`
	}
	err = json.NewDecoder(resp.Body).Decode(&echoed)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || err != nil || len(echoed.Headers["Content-Length"]) != 1 || echoed.Headers["Content-Length"][0] != "1048576" {
		t.Errorf("POST /anything with 1 MiB: %s, %v, headers %v; want 200 echoing Content-Length 1048576", resp.Status, err, echoed.Headers)
	}
}
