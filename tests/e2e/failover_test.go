package e2e

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"skipper.dev/skipper/internal/poll"
)

// TestKillOwnerControllerMidLoad: kill -9 of the controller replica that
// owns a function, while warm traffic flows, fails no request (routers
// serve warm calls from their cache), and scaling resumes: more load after
// the kill still scales the function up, under a new owner or the
// restarted one.
func TestKillOwnerControllerMidLoad(t *testing.T) {
	const fn = "failover"
	createFunction(t, fn, map[string]any{
		"scaling":     map[string]any{"targetInFlight": int64(1)},
		"idleTimeout": "5m",
	})
	ref := "default/" + fn
	firstCall(t, ref)
	owner := functionOwner(t, fn)

	// Two callers, a request in flight each: two instances.
	stop := make(chan struct{})
	calls, failures, wait := load(t, ref, "sleep=100ms", 2, stop)
	stopped := false
	stopLoad := func() {
		if !stopped {
			stopped = true
			close(stop)
			wait()
		}
	}
	t.Cleanup(stopLoad)
	poll.Until(t, 30*time.Second, 200*time.Millisecond, "two instances under load", func(context.Context) error {
		if n := instances(t, fn); n < 2 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})

	pod, err := env.kube.CoreV1().Pods("skipper-system").Get(t.Context(), owner, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("owner pod %s: %v", owner, err)
	}
	pid := containerPid(t, pod, "controller")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 the owner %s (pid %d): %v", owner, pid, err)
	}
	killed := time.Now()
	t.Logf("killed owner %s (pid %d) with %d calls made", owner, pid, calls.Load())

	// Twice the load: desired reaches maxInstances 3 once a supervisor runs.
	more, moreFailures, waitMore := load(t, ref, "sleep=100ms", 2, stop)
	t.Cleanup(func() { stopLoad(); waitMore() })
	poll.Until(t, 60*time.Second, 200*time.Millisecond, "three instances after the owner was killed", func(context.Context) error {
		if n := instances(t, fn); n < 3 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
	t.Logf("scaled to 3 instances %s after the kill", time.Since(killed).Round(100*time.Millisecond))
	newOwner, _ := functionStatus(t, fn)["owner"].(string)
	stopLoad()
	waitMore()
	t.Logf("owner after the kill: %s; calls %d + %d", newOwner, calls.Load(), more.Load())
	if n := failures.Load() + moreFailures.Load(); n > 0 {
		t.Errorf("%d warm calls failed around the kill", n)
	}
	// The killed replica is back (restarted in place) before later tests
	// read every controller's metrics.
	poll.Until(t, 60*time.Second, 200*time.Millisecond, "every controller ready again", controllersReady)
}
