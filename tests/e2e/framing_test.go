package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// Issue 30: a Connection field naming the framing splits no request.

// echoSeen calls function's path through the router and returns the pod
// that answered and how many requests for path it has read (skipper-echo's
// "seen").
func echoSeen(t *testing.T, function, path string) (pod string, seen uint64) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, env.routerURL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-skipper-function", function)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	var body struct {
		Pod struct {
			UID string `json:"uid"`
		} `json:"pod"`
		Seen uint64 `json:"seen"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("GET %s: decode %s: %v", path, b, err)
	}
	return body.Pod.UID, body.Seen
}

// TestFramingSplitRefused: issue 30's request, as a tenant sent it to node
// 1's router: a POST whose Connection field names its Content-Length and
// whose body is a whole GET /smuggled with a forged X-Skipper-Caller. The
// router answers 400 bad_connection_header and counts it, and the
// function's one instance has read no /smuggled: the legitimate GET
// /smuggled after it is the first it sees.
func TestFramingSplitRefused(t *testing.T) {
	const fn = "e2e-framing"
	ref := "default/" + fn
	createFunction(t, fn, map[string]any{"minInstances": int64(1), "maxInstances": int64(1), "idleTimeout": "5m"})
	firstCall(t, ref)
	pod, _ := echoSeen(t, ref, "/warm")
	refused := func() float64 {
		return counterSum(t, env.routerMetrics, "skipper_noderouter_rejected_total", map[string]string{"reason": "bad_connection_header"})
	}
	before := refused()

	u, err := url.Parse(env.routerURL)
	if err != nil {
		t.Fatal(err)
	}
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: " + fn + ".default.fn\r\nX-Skipper-Caller: ns-b/admin\r\n\r\n"
	outer := fmt.Sprintf("POST /outer HTTP/1.1\r\nHost: %s\r\nX-Skipper-Function: %s\r\nConnection: Content-Length\r\nContent-Length: %d\r\n\r\n%s",
		u.Host, ref, len(smuggled), smuggled)
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatalf("dial router: %v", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, outer); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the answer to the split request: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	var answer struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(b, &answer)
	if resp.StatusCode != http.StatusBadRequest || answer.Reason != "bad_connection_header" {
		t.Errorf("the split request got %d %s, want 400 with reason bad_connection_header", resp.StatusCode, b)
	}
	if got := refused() - before; got != 1 {
		t.Errorf("rejected_total{reason=bad_connection_header} grew by %v, want 1", got)
	}

	// The count: the instance's first /smuggled is this one.
	got, seen := echoSeen(t, ref, "/smuggled")
	if got != pod {
		t.Fatalf("pod %s answered, want the function's one instance %s", got, pod)
	}
	if seen != 1 {
		t.Errorf("the instance has read %d requests for /smuggled, want 1 (this one): %d went around the router", seen, seen-1)
	}
}
