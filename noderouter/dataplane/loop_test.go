package dataplane

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/route"
)

// loopRouter serves a proxy with --forwarder=loop (whatever the forwarder
// under test) for one instance at addr, and returns it and its address.
func loopRouter(t *testing.T, addr string, mutate func(*Options)) (*Proxy, string) {
	t.Helper()
	res := &fakeResolver{cache: &route.Cache{}, addr: addr, upd: route.Update{Generation: 1,
		Instances: []route.InstanceInfo{{Pod: "pod-1", PodUID: "uid-1", Address: addr}}}}
	p := testProxy(t, res, mutate)
	url := serveProxyWith(t, p, ForwarderLoop)
	// Warm: the first request fills the cache (GetInstance, through the
	// goroutine path).
	if _, a := res.cache.Lookup(route.Ref{Namespace: "default", Name: "echo"}); a == nil {
		if _, _, err := res.Resolve(t.Context(), route.Ref{Namespace: "default", Name: "echo"}, 0, nil, Caller{}); err != nil {
			t.Fatal(err)
		}
	}
	return p, strings.TrimPrefix(url, "http://")
}

// rawInstance answers each request read on its connections with answer's
// bytes (written as they are: framing is the test's), and records the
// request heads.
func rawInstance(t *testing.T, answer func(n int, head string) string) (string, <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	heads := make(chan string, 1000)
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					var b strings.Builder
					_ = req.Header.Write(&b)
					heads <- req.Method + " " + req.RequestURI + "\n" + b.String()
					if a := answer(int(n.Add(1)), req.Method); a == "" {
						return // close without answering
					} else if _, err := io.WriteString(c, a); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), heads
}

// TestLoopServesWarmGETs: warm bodiless GETs and HEADs on one keep-alive
// connection (pipelined too) are answered by the event loop, with the
// X-Forwarded-* fields and without the router's own header; nothing is
// handed over.
func TestLoopServesWarmGETs(t *testing.T) {
	t.Parallel()
	addr, heads := rawInstance(t, func(int, string) string {
		return "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-From: instance\r\n\r\nhello"
	})
	p, router := loopRouter(t, addr, nil)
	c, err := net.Dial("tcp", router)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	const n = 20
	// Ten one at a time, then ten pipelined in one write.
	req := "GET /x?y=1 HTTP/1.1\r\nHost: r\r\nX-Skipper-Function: default/echo\r\n\r\n"
	for i := range n {
		if i < n/2 {
			_, err = io.WriteString(c, req)
		} else if i == n/2 {
			_, err = io.WriteString(c, strings.Repeat(req, n/2))
		}
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != "hello" || resp.Header.Get("X-From") != "instance" {
			t.Fatalf("response %d: %d %q %v", i, resp.StatusCode, b, resp.Header)
		}
	}
	for range n {
		h := <-heads
		for _, want := range []string{"GET /x?y=1\n", "X-Forwarded-For: 127.0.0.1", "X-Forwarded-Proto: http", "Forwarded: for=127.0.0.1;host=\"r\";proto=http"} {
			if !strings.Contains(h, want) {
				t.Fatalf("instance got\n%s\nwant %q in it", h, want)
			}
		}
		if strings.Contains(h, "X-Skipper-Function") {
			t.Fatalf("instance got the router's own header:\n%s", h)
		}
	}
	if got := routertest.Counter(p.m.loopServed); got != n {
		t.Errorf("loop served %v requests, want %d", got, n)
	}
	for r, m := range p.m.handovers {
		if got := routertest.Counter(m); got != 0 {
			t.Errorf("%v handovers for %s, want none", got, r)
		}
	}
}

// TestLoopHandsOver: what the loop does not serve reaches the goroutine
// path with its connection, before anything was sent (a POST with a body)
// or in the middle (a chunked answer), and is answered whole; requests
// after it on the same connection are answered too.
func TestLoopHandsOver(t *testing.T) {
	t.Parallel()
	addr, _ := rawInstance(t, func(n int, method string) string {
		if method == "GET" && n%2 == 0 {
			return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	})
	tests := []struct {
		name, req, want, reason string
	}{
		{"POST with a body", "POST / HTTP/1.1\r\nHost: r\r\nX-Skipper-Function: default/echo\r\nContent-Length: 3\r\n\r\nabc", "ok", handoverRequest},
		{"chunked answer", "GET / HTTP/1.1\r\nHost: r\r\nX-Skipper-Function: default/echo\r\n\r\n", "abc", handoverAnswer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, router := loopRouter(t, addr, nil)
			c, err := net.Dial("tcp", router)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			// A warm GET first (served by the loop: answers alternate, the
			// first of each connection's pair is not chunked)...
			for i, r := range []string{tt.req, tt.req} {
				if _, err := io.WriteString(c, r); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 200 || (string(b) != tt.want && string(b) != "ok") {
					t.Fatalf("request %d: %d %q", i, resp.StatusCode, b)
				}
			}
			if got := routertest.Counter(p.m.handovers[tt.reason]); got != 1 {
				t.Errorf("%v handovers for %s, want 1", got, tt.reason)
			}
		})
	}
}

// TestLoopRetriesABrokenSend: an instance that closes the connection
// without answering: the request is sent again (a GET may be), by the
// loop on a new connection when the closed one was kept alive, and by the
// goroutine path after that, which answers 502 after --max-attempts.
func TestLoopRetriesABrokenSend(t *testing.T) {
	t.Parallel()
	addr, heads := rawInstance(t, func(n int, _ string) string {
		if n == 1 || n == 3 {
			return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		}
		return "" // the second request on each connection: closed unanswered
	})
	_, router := loopRouter(t, addr, func(c *Options) { c.MaxAttempts = 2; c.RetryBackoffBase = time.Millisecond })
	client := &http.Client{Timeout: 10 * time.Second}
	for i, want := range []int{200, 200} {
		req, _ := http.NewRequest("GET", "http://"+router+"/", nil)
		req.Header.Set(HeaderFunction, "default/echo")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d %s, want %d", i, resp.StatusCode, b, want)
		}
	}
	if got := len(heads); got < 3 {
		t.Errorf("the instance saw %d requests, want the broken one sent again (3 or more)", got)
	}
}

// rawAnswerOnce answers every request on a connection with a (its bytes
// as they are), then closes the connection when closeAfter.
func rawAnswerOnce(t *testing.T, a string, closeAfter bool, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		close(done)
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					select {
					case <-time.After(delay):
					case <-done:
						return
					}
					if _, err := io.WriteString(c, a); err != nil || closeAfter {
						return
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

// TestLoopEdgeCases: answers and callers the loop meets rarely end as
// the goroutine path ends them, at once (an edge-triggered loop that
// missed the last edge would wait for the request timeout).
func TestLoopEdgeCases(t *testing.T) {
	// Not parallel: it bounds how soon the 504s come (the timeout + 800ms).
	const get = "GET / HTTP/1.1\r\nHost: r\r\nX-Skipper-Function: default/echo\r\n\r\n"
	tests := []struct {
		name       string
		answer     string
		closeAfter bool
		delay      time.Duration
		timeout    time.Duration // the function's
		send       string        // the caller's bytes
		halfClose  bool          // the caller shuts its side down after send
		want       []string      // status and body of each answer, in order
	}{
		{name: "body cut short after the head: 502", answer: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", closeAfter: true,
			send: get, want: []string{"502"}},
		{name: "answer with bare LF lines", answer: "HTTP/1.1 200 OK\nContent-Length: 2\n\nhi",
			send: get, want: []string{"200 hi"}},
		{name: "pipelined request with bare LF lines, then CRLF", answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
			send: "GET /a HTTP/1.1\nHost: r\nX-Skipper-Function: default/echo\n\n" + get, want: []string{"200 hi", "200 hi"}},
		{name: "caller shuts its side down after the request", answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
			send: get, halfClose: true, want: []string{"200 hi"}},
		{name: "function timeout", answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", delay: 2 * time.Second, timeout: 300 * time.Millisecond,
			send: get, want: []string{"504"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := rawAnswerOnce(t, tt.answer, tt.closeAfter, tt.delay)
			res := &fakeResolver{cache: &route.Cache{}, addr: addr}
			p := testProxy(t, res, nil)
			res.cache.Store(route.Ref{Namespace: "default", Name: "echo"}, route.Update{Generation: 1,
				Instances: []route.InstanceInfo{{Pod: "pod-1", PodUID: "uid-1", Address: addr}}, Config: route.Config{Timeout: tt.timeout}})
			router := strings.TrimPrefix(serveProxyWith(t, p, ForwarderLoop), "http://")
			c, err := net.Dial("tcp", router)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(3 * time.Second)) // well below the default request timeout
			if _, err := io.WriteString(c, tt.send); err != nil {
				t.Fatal(err)
			}
			if tt.halfClose {
				_ = c.(*net.TCPConn).CloseWrite()
			}
			br := bufio.NewReader(c)
			start := time.Now()
			for i, want := range tt.want {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("answer %d: %v", i, err)
				}
				b, _ := io.ReadAll(resp.Body)
				got := strconv.Itoa(resp.StatusCode)
				if resp.StatusCode == 200 {
					got += " " + string(b)
				}
				if got != want {
					t.Fatalf("answer %d: %q, want %q", i, got, want)
				}
			}
			if tt.timeout > 0 {
				if took := time.Since(start); took > tt.timeout+800*time.Millisecond {
					t.Errorf("the 504 came after %v, want about the function's timeout %v", took, tt.timeout)
				}
			}
		})
	}
}
