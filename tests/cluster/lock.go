package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// machineLock names an abstract unix socket (root network namespace): only
// one local cluster runs per machine, whatever its state directory. Holding
// it needs no file, and the kernel drops it when the holder dies.
const machineLock = "@skipper-local-cluster"

// acquireMachineLock takes the machine-wide cluster lock, waiting up to wait
// for another cluster (a test's, with its own state directory) to stop.
func acquireMachineLock(ctx context.Context, wait time.Duration) (release func(), err error) {
	deadline := time.Now().Add(wait)
	for {
		l, err := net.Listen("unix", machineLock)
		if err == nil {
			return func() { l.Close() }, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("machine lock %s: %w", machineLock, err)
		}
		if !time.Now().Before(deadline) {
			return nil, fmt.Errorf("%w: another local cluster holds the machine lock (one with another state directory, e.g. a test's); waited %s", ErrRunning, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// MachineLockHeld reports whether a local cluster holds the machine lock.
func MachineLockHeld() bool {
	l, err := net.Listen("unix", machineLock)
	if err != nil {
		return errors.Is(err, syscall.EADDRINUSE)
	}
	l.Close()
	return false
}
