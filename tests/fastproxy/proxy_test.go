package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func TestMain(m *testing.M) {
	// fasthttp's background goroutines, none of which it lets a caller
	// stop: a HostClient's connection cleaner and a server's worker-pool
	// cleaner end on their own up to MaxIdleConnDuration and
	// MaxIdleWorkerDuration after the last connection and the server are
	// gone; the default dialer's address-cache cleaner and the Date line's
	// refresher are package-wide and never end.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	)
}

// startProxy serves the proxy in front of upstream on loopback until the
// test ends and returns its base URL.
func startProxy(t *testing.T, upstream string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, upstream, log.New(io.Discard, "", 0)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

func client(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// TestProxyPassesThrough: a request's method, path, body and headers reach
// the upstream, X-Skipper-Function (any case) excepted, and the answer
// comes back whole.
func TestProxyPassesThrough(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var fn []string
		for k, v := range r.Header {
			if strings.EqualFold(k, "X-Skipper-Function") {
				fn = append(fn, v...)
			}
		}
		w.Header().Set("X-Method", r.Method)
		w.Header().Set("X-Uri", r.RequestURI)
		w.Header().Set("X-Kept", r.Header.Get("X-Kept"))
		w.Header().Set("X-Function", strings.Join(fn, ","))
		w.Header().Set("X-Transfer-Encoding", strings.Join(r.TransferEncoding, ","))
		_, _ = w.Write(body)
	}))
	t.Cleanup(upstream.Close)
	base := startProxy(t, strings.TrimPrefix(upstream.URL, "http://"))
	c := client(t)

	type answer struct {
		Status                                        int
		Method, URI, Kept, Function, TransferEncoding string
		Body                                          string
	}
	for _, tc := range []struct {
		name, method, path string
		header             map[string]string // set as spelled
		body               io.Reader
		want               answer
	}{
		{"GET with a body, the header canonical", http.MethodGet, "/bench?a=1",
			map[string]string{"X-Skipper-Function": "default/echo", "X-Kept": "yes"}, strings.NewReader("hello body"),
			answer{200, "GET", "/bench?a=1", "yes", "", "", "hello body"}},
		{"the header lower-case", http.MethodGet, "/",
			map[string]string{"x-skipper-function": "default/echo", "X-Kept": "yes"}, strings.NewReader("x"),
			answer{200, "GET", "/", "yes", "", "", "x"}},
		{"the header twice, two spellings", http.MethodGet, "/",
			map[string]string{"x-skipper-function": "a/b", "X-SKIPPER-FUNCTION": "c/d"}, nil,
			answer{200, "GET", "/", "", "", "", ""}},
		{"path not normalised", http.MethodGet, "/a//b/../c%2Fd",
			nil, nil, answer{200, "GET", "/a//b/../c%2Fd", "", "", "", ""}},
		{"POST with a chunked body streams on", http.MethodPost, "/up",
			nil, io.MultiReader(strings.NewReader("part one, "), strings.NewReader("part two")),
			answer{200, "POST", "/up", "", "", "chunked", "part one, part two"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tc.method, base+tc.path, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.header {
				req.Header[k] = []string{v} // as spelled: Set would canonicalise
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			got := answer{resp.StatusCode, resp.Header.Get("X-Method"), resp.Header.Get("X-Uri"), resp.Header.Get("X-Kept"),
				resp.Header.Get("X-Function"), resp.Header.Get("X-Transfer-Encoding"), string(body)}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
}

// TestProxyStreamsChunked: a chunked answer reaches the caller chunk by
// chunk, as the upstream writes it: the upstream holds its second chunk
// until the caller has read the first.
func TestProxyStreamsChunked(t *testing.T) {
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "second\n")
	}))
	t.Cleanup(upstream.Close)
	// Cleanups run last first: the handler is let go before Close waits
	// for it, on every way out of the test.
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	base := startProxy(t, strings.TrimPrefix(upstream.URL, "http://"))

	resp, err := client(t).Get(base + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if diff := cmp.Diff([]string{"chunked"}, resp.TransferEncoding); diff != "" {
		t.Errorf("Transfer-Encoding (-want +got):\n%s", diff)
	}
	br := bufio.NewReader(resp.Body)
	first := make(chan string, 1)
	go func() {
		line, _ := br.ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if line != "first\n" {
			t.Fatalf("first chunk %q, want %q", line, "first\n")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first chunk did not arrive before the upstream finished: the proxy buffers")
	}
	releaseOnce()
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if string(rest) != "second\n" {
		t.Errorf("rest %q, want %q", rest, "second\n")
	}
}

// TestProxyUpstreamDown: a refused upstream is a 502.
func TestProxyUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	resp, err := client(t).Get(startProxy(t, addr) + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502", resp.StatusCode)
	}
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    Config
		wantErr string
	}{
		{"upstream only", []string{"-upstream", "198.18.1.9:8080"}, Config{Listen: defaultListen, Upstream: "198.18.1.9:8080"}, ""},
		{"all", []string{"-listen", "198.51.100.11:18083", "-upstream", "198.18.1.9:8080", "-procs", "2"},
			Config{Listen: "198.51.100.11:18083", Upstream: "198.18.1.9:8080", Procs: 2}, ""},
		{"no upstream", nil, Config{}, "-upstream: required"},
		{"upstream without a port", []string{"-upstream", "198.18.1.9"}, Config{}, "want host:port"},
		{"bad listen and procs at once", []string{"-upstream", "a:1", "-listen", "x", "-procs", "-1"}, Config{}, "-procs -1"},
		{"stray argument", []string{"-upstream", "a:1", "extra"}, Config{}, "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseFlags(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var stderr strings.Builder
	if err := run(t.Context(), []string{"--help"}, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: err = %v, want flag.ErrHelp", err)
	}
	golden := filepath.Join("testdata", "help.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(stderr.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test -run TestHelp -update)", err)
	}
	if diff := cmp.Diff(string(want), stderr.String()); diff != "" {
		t.Errorf("--help (-want +got):\n%s", diff)
	}
}
