package dataplane

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/internal/routertest"
)

// dialPeer returns an instance connection of the pool's kind (a sock) to
// a peer that serve runs on.
func dialPeer(t *testing.T, serve func(net.Conn)) *upConn {
	t.Helper()
	ln := routertest.Listen(t)
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serve(c)
	}()
	p := newUpstreamPool(&net.Dialer{}, 4, time.Minute)
	up, err := p.dial(context.Background(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	if up.d == nil {
		t.Fatalf("the pool's connection is a %T, not a sock", up.Conn)
	}
	return up
}

// TestAliveSeesClosedSock: alive peeks through the sock's RawConn, so an
// idle instance connection the instance closed (with stray bytes) is not
// reused.
func TestAliveSeesClosedSock(t *testing.T) {
	t.Parallel()
	up := dialPeer(t, func(c net.Conn) { _, _ = c.Write([]byte("stray")) })
	poll.Until(t, pollTimeout, pollInterval, "alive to see the closed connection", func(context.Context) error { return poll.Unmet(!alive(up), "still alive") })
}

// TestDeferNextOnlyBeforeAWrite: a flush that writes nothing leaves no
// write armed, so what is written next (a tunnel's bytes) goes out.
func TestDeferNextOnlyBeforeAWrite(t *testing.T) {
	t.Parallel()
	const want = 4 + 32<<10 + 5
	got := make(chan int, 1)
	up := dialPeer(t, func(c net.Conn) {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _ := io.ReadFull(c, make([]byte, want))
		got <- n
	})
	up.bw.WriteString("head")
	up.bw.Write(make([]byte, 32<<10)) // larger than what is buffered: written at once
	up.d.deferNext()                  // what exchange does only before a non-empty flush: the sock refuses it too
	if err := up.bw.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := up.Conn.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if n := <-got; n != want {
		t.Errorf("the peer got %d bytes, want %d (armed %v, %d pending)", n, want, up.d.armed, len(up.d.pending))
	}
}

// TestNoDeferAfterPartOfARequest: an instance that answers before the
// request's last bytes (an early 413 to a body) is read, not waited for:
// a write is put off only when nothing of the request went out yet.
func TestNoDeferAfterPartOfARequest(t *testing.T) {
	t.Parallel()
	up := dialPeer(t, func(c net.Conn) {
		_, _ = c.Read(make([]byte, 100)) // the head
		_, _ = c.Write([]byte("HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\n\r\n"))
		_, _ = io.Copy(io.Discard, c)
	})
	if _, err := up.Conn.Write([]byte("POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, pollInterval, "the early answer in the socket", func(context.Context) error { return poll.Unmet(!alive(up), "still alive") })
	up.d.deferNext()
	if _, err := up.Conn.Write([]byte("body")); err != nil {
		t.Fatal(err)
	}
	_ = up.Conn.SetDeadline(time.Now().Add(5 * time.Second))
	if n, err := up.Conn.Read(make([]byte, 100)); err != nil {
		t.Errorf("read: %d bytes, %v; the answer was in the socket", n, err)
	}
}
