package poll

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Until calls cond at once, then interval after each call returns, until
// cond returns nil. When timeout passes first it fails t (Fatalf) with what
// and cond's last error, so that error should say what was seen. cond gets a
// context that ends at the timeout, for the calls it makes; it is not t's
// context, so Until works in a Cleanup too. Call it from the test's
// goroutine.
//
// Not wait.PollUntilContextTimeout: that ticks from the start of each call,
// so a slow condition is called again at once.
func Until(t testing.TB, timeout, interval time.Duration, what string, cond func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		err := cond(ctx)
		if err == nil {
			return
		}
		timer.Reset(interval)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
			return
		}
	}
}

// Unmet is a condition's answer: nil when ok, else an error saying what
// was seen (format and args, as fmt.Errorf).
func Unmet(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}
