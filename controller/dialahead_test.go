package controller

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestDialAheadHandsOverTheConnection: the connection started ahead is the
// one the next dial for that address gets, exactly one is accepted, and a
// connection nobody took is closed on release.
func TestDialAheadHandsOverTheConnection(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	var accepted atomic.Int32
	conns := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conns <- c
		}
	}()
	addr := lis.Addr().String()
	d := newDialAhead(time.Second)
	ctx := t.Context()

	release := d.start(ctx, addr)
	server := <-conns // the handshake happened before anyone asked for it
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if c.LocalAddr().String() != server.RemoteAddr().String() {
		t.Errorf("dial got %s, want the connection opened ahead (%s)", c.LocalAddr(), server.RemoteAddr())
	}
	release() // taken: release must not close it
	if _, err := c.Write([]byte("x")); err != nil {
		t.Errorf("connection closed by release after it was taken: %v", err)
	}
	c.Close()
	if n := accepted.Load(); n != 1 {
		t.Errorf("%d connections accepted, want 1", n)
	}

	// Not taken: release closes it, and the server sees EOF.
	release = d.start(ctx, addr)
	server = <-conns
	release()
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := server.Read(make([]byte, 1)); err == nil {
		t.Error("connection not taken is still open after release")
	}
	// Nothing ahead: a plain dial.
	c, err = d.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	<-conns
	if n := accepted.Load(); n != 3 {
		t.Errorf("%d connections accepted, want 3", n)
	}
}
