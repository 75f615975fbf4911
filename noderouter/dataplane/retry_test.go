package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	const base, max = 10 * time.Millisecond, 500 * time.Millisecond
	tests := []struct {
		name string
		n    int
		u    float64
		want time.Duration
	}{
		{"first retry, no jitter", 1, 0, 5 * time.Millisecond},
		{"first retry, most jitter", 1, 0.999999, 10 * time.Millisecond},
		{"first retry, half jitter", 1, 0.5, 7500 * time.Microsecond},
		{"second retry doubles", 2, 0, 10 * time.Millisecond},
		{"third retry", 3, 0.5, 30 * time.Millisecond},
		{"capped at max", 7, 0, 250 * time.Millisecond},
		{"capped at max, most jitter", 40, 0.999999, 500 * time.Millisecond},
		{"never overflows", 1 << 20, 0.5, 375 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := backoff(tt.n, base, max, tt.u)
			if d := got - tt.want; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("backoff(%d, u=%v) = %v, want %v", tt.n, tt.u, got, tt.want)
			}
		})
	}
	// Whatever u, the wait stays in [d/2, d] of its step.
	for n := 1; n <= 10; n++ {
		for _, u := range []float64{0, 0.25, 0.5, 0.75, 0.999999} {
			d := min(base<<(n-1), max)
			if got := backoff(n, base, max, u); got < d/2 || got > d {
				t.Errorf("backoff(%d, %v) = %v outside [%v, %v]", n, u, got, d/2, d)
			}
		}
	}
}

func TestSleepRespectsCancellation(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sleep(ctx, time.Hour) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("sleep = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sleep ignored its context")
	}
	if err := sleep(t.Context(), time.Microsecond); err != nil {
		t.Errorf("sleep to the end = %v", err)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	// What net returns for a dial whose Dialer.Timeout passed (a dropped
	// SYN): it matches context.DeadlineExceeded.
	ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	_, dialTimeout := (&net.Dialer{}).DialContext(ctx, "tcp", "127.0.0.1:1")
	if !isDialError(dialTimeout) || !errors.Is(dialTimeout, context.DeadlineExceeded) {
		t.Fatalf("dial past its deadline: %#v", dialTimeout)
	}
	tests := []struct {
		name    string
		err     error
		reqDone bool
		want    failure
	}{
		{"dial refused", fmt.Errorf("proxy: %w", dial), false, failDial},
		{"dial timeout", &net.OpError{Op: "dial", Err: os.ErrDeadlineExceeded}, false, failDial},
		{"dial timeout as net returns it", dialTimeout, false, failDial},
		{"reset", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, false, failConn},
		{"broken pipe", &net.OpError{Op: "write", Err: os.NewSyscallError("write", syscall.EPIPE)}, false, failConn},
		{"eof before a response", fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", io.EOF), false, failConn},
		{"unexpected eof", io.ErrUnexpectedEOF, false, failConn},
		{"server closed idle connection", errors.New("http: server closed idle connection"), false, failConn},
		{"caller gone", context.Canceled, true, failOther},
		{"dial cancelled by the caller", &net.OpError{Op: "dial", Err: context.Canceled}, true, failOther},
		{"dial cut by the request timeout", dialTimeout, true, failOther},
		{"request timeout", context.DeadlineExceeded, true, failOther},
		{"reset as the caller left", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true, failOther},
		{"body too large", &http.MaxBytesError{Limit: 10}, false, failOther},
		{"malformed response", errors.New(`net/http: HTTP/1.x transport: malformed HTTP response "x"`), false, failOther},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := classify(tt.err, tt.reqDone); got != tt.want {
				t.Errorf("classify(%v, %v) = %v, want %v", tt.err, tt.reqDone, got, tt.want)
			}
		})
	}
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		f           failure
		method      string
		key         bool
		bodyStarted bool
		want        bool
	}{
		{"GET dial", failDial, "GET", false, false, true},
		{"GET reset", failConn, "GET", false, false, true},
		{"HEAD reset", failConn, "HEAD", false, false, true},
		{"OPTIONS reset", failConn, "OPTIONS", false, false, true},
		{"PUT reset, body not sent", failConn, "PUT", false, false, true},
		{"DELETE reset", failConn, "DELETE", false, false, true},
		{"PUT reset, body sent: it is gone", failConn, "PUT", false, true, false},
		{"POST dial: it never left", failDial, "POST", false, false, true},
		{"POST reset: may have run", failConn, "POST", false, false, false},
		{"PATCH reset", failConn, "PATCH", false, false, false},
		{"POST reset with Idempotency-Key", failConn, "POST", true, false, true},
		{"POST body sent, with Idempotency-Key", failConn, "POST", true, true, false},
		{"POST body sent", failConn, "POST", false, true, false},
		{"POST body sent, dial", failDial, "POST", false, true, false},
		{"GET timeout", failOther, "GET", false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retryable(tt.f, idempotent(tt.method, tt.key), tt.bodyStarted); got != tt.want {
				t.Errorf("retryable = %v, want %v", got, tt.want)
			}
		})
	}
}
