package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

// start runs one loop on a free loopback port in front of h.
func start(t *testing.T, h http.Handler) string {
	t.Helper()
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	ua := netip.MustParseAddrPort(strings.TrimPrefix(up.URL, "http://"))
	l, err := newLoop(netip.MustParseAddrPort("127.0.0.1:0"), ua)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := l.addr()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.run() }()
	t.Cleanup(func() {
		l.stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return addr.String()
}

func TestForwardsKeptAliveAndPipelined(t *testing.T) {
	addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", r.URL.Path, r.Header.Get("X-Forwarded-For"))
	}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	// Two requests in one write: answered in order on one connection.
	if _, err := io.WriteString(c, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"/a 198.51.100.1", "/b 198.51.100.1"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != want {
			t.Fatalf("got %d %q, want 200 %q", resp.StatusCode, b, want)
		}
	}
}

func TestClosesWhatItDoesNotForward(t *testing.T) {
	addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx"); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes, want the connection closed", n)
	}
}
