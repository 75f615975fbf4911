package kubedial

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"skipper.dev/skipper/internal/poll"
)

func TestRefused(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{refused, true},
		{fmt.Errorf("wrapped: %w", refused), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}, false},
		{context.DeadlineExceeded, false},
	} {
		if got := Refused(c.err); got != c.want {
			t.Errorf("Refused(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// freePort returns a loopback address nothing listens on.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func newTestDialer() *Dialer {
	d := New(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	d.every = 20 * time.Millisecond
	return d
}

// A dial to a port that refuses waits until something listens there, and
// then returns a connection to it.
func TestDialWaitsOutRefusals(t *testing.T) {
	t.Parallel()
	addr := freePort(t)
	d := newTestDialer()
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := d.DialContext(t.Context(), "tcp", addr)
		done <- result{c, err}
	}()
	poll.Until(t, 10*time.Second, 5*time.Millisecond, "two refused tries", func(context.Context) error {
		if n := d.Refusals(); n < 2 {
			return fmt.Errorf("%d refused tries", n)
		}
		return nil
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s again: %v", addr, err)
	}
	defer ln.Close()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("dial after the listener came: %v", r.err)
		}
		if got := r.c.RemoteAddr().String(); got != addr {
			t.Errorf("connected to %s, want %s", got, addr)
		}
		r.c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the dial did not return within 10 s of the listener")
	}
	if n := d.Refusals(); n != 0 {
		t.Errorf("refused tries after an accepted one: %d, want 0", n)
	}
}

// A dial that keeps being refused ends with its context, saying both.
func TestDialEndsWithItsContext(t *testing.T) {
	t.Parallel()
	d := newTestDialer()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := d.DialContext(ctx, "tcp", freePort(t))
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("err = %v, want the deadline and the refusal", err)
	}
}

// A dial still refused when the Dialer's lifetime ends returns then,
// whatever its request's context: net/http dials on without the request's
// cancellation.
func TestDialEndsWithItsLifetime(t *testing.T) {
	t.Parallel()
	life, end := context.WithCancel(t.Context())
	d := newTestDialer()
	d.life = life
	addr := freePort(t)
	done := make(chan error, 1)
	go func() {
		_, err := d.DialContext(context.Background(), "tcp", addr)
		done <- err
	}()
	poll.Until(t, 10*time.Second, 10*time.Millisecond, "a refused try", func(context.Context) error {
		if d.Refusals() == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	end()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("err = %v, want the lifetime's end and the refusal", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the dial did not return within 10 s of the lifetime's end")
	}
}

// A failure other than a refusal is returned at once: client-go's own
// backoff handles it.
func TestDialOtherFailureAtOnce(t *testing.T) {
	t.Parallel()
	d := newTestDialer()
	tries := 0
	want := errors.New("no route")
	d.dial = func(context.Context, string, string) (net.Conn, error) {
		tries++
		return nil, want
	}
	if _, err := d.DialContext(t.Context(), "tcp", "192.0.2.1:443"); !errors.Is(err, want) || tries != 1 {
		t.Errorf("err = %v after %d tries, want %v after 1", err, tries, want)
	}
}
