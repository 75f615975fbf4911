package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/tests/attach"
	"skipper.dev/skipper/tests/linuxhost"
)

// routerMetricsURL is node n's router metrics endpoint (node IP:8381).
func routerMetricsURL(n int) string { return fmt.Sprintf("http://198.51.100.%d:8381/metrics", 10+n) }

// TestBPFSteersVIPToOwnNodeRouter: a process on node 2 (in node 2's network
// namespace and cgroup, as a pod there) calling the skipper Service's
// ClusterIP:80 is steered by node 2's router's BPF programs to node 2's
// router — the VIP learnt from the Service through the API server — and no
// other router sees the call.
func TestBPFSteersVIPToOwnNodeRouter(t *testing.T) {
	ctx := t.Context()
	svc, err := env.kube.CoreV1().Services("skipper-system").Get(ctx, "skipper", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := svc.Spec.ClusterIP
	for n := 1; n <= 2; n++ {
		poll.Until(t, time.Minute, pollInterval, fmt.Sprintf("node%d's router steers with BPF", n), func(context.Context) error {
			if v := metricSum(t, routerMetricsURL(n), "skipper_noderouter_bpf_mode", map[string]string{"mode": "connect"}); v != 1 {
				return fmt.Errorf("bpf_mode{mode=connect} = %v", v)
			}
			return nil
		})
	}
	echo := map[string]string{"function": "default/echo", "code": "200"}
	rewrites2 := metricSum(t, routerMetricsURL(2), "skipper_noderouter_bpf_rewrites_total", nil)
	served1 := counterSum(t, routerMetricsURL(1), "skipper_noderouter_requests_total", echo)
	served2 := counterSum(t, routerMetricsURL(2), "skipper_noderouter_requests_total", echo)

	// The VIP is blackholed outside the cluster's namespaces, so an
	// unsteered call could not succeed.
	const calls = 3
	for range calls {
		out, err := callVIPFromNode2(ctx, t, vip, 10*time.Second)
		if err != nil {
			t.Fatalf("call %s:80 from node2: %v\n%s", vip, err, out)
		}
		if !strings.Contains(out, `"function":"default/echo"`) {
			t.Fatalf("answer via the VIP is not the echo function's: %s", out)
		}
	}
	if got := metricSum(t, routerMetricsURL(2), "skipper_noderouter_bpf_rewrites_total", nil) - rewrites2; got < calls {
		t.Errorf("node2 rewrote %v connects, want ≥ %d", got, calls)
	}
	// A router counts a request once it has answered it: the last count
	// may come just after curl has the answer.
	poll.Until(t, 5*time.Second, pollInterval, "node2's router counts the calls", func(context.Context) error {
		if got := counterSum(t, routerMetricsURL(2), "skipper_noderouter_requests_total", echo) - served2; got != calls {
			return fmt.Errorf("node2's router served %v calls, want %d", got, calls)
		}
		return nil
	})
	if got := counterSum(t, routerMetricsURL(1), "skipper_noderouter_requests_total", echo) - served1; got != 0 {
		t.Errorf("node1's router served %v of node2's calls, want 0", got)
	}
}

// callVIPFromNode2 calls the skipper Service VIP from a process in node 2's
// cgroup and network namespace (where node 2's BPF programs apply), bounded
// by timeout, and returns curl's combined output. The caller joins the
// cgroup first, then execs into the netns and curl: ip netns exec remounts
// /sys, hiding the cgroup filesystem.
func callVIPFromNode2(ctx context.Context, t *testing.T, vip string, timeout time.Duration) (string, error) {
	t.Helper()
	mnt, err := linuxhost.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, "sh", "-c",
		`echo $$ > "$1/cgroup.procs" && exec ip netns exec skipper-node2 curl -sS --max-time "$3" -H 'x-skipper-function: default/echo' "http://$2/vip"`,
		"caller", filepath.Join(mnt, "skipper", "node2"), vip, fmt.Sprint(timeout.Seconds())).CombinedOutput()
	return string(out), err
}

// routerPid returns the pid of the node router running in the network
// namespace netns (hostNetwork: the node's own).
func routerPid(t *testing.T, netns string) int {
	t.Helper()
	pids, err := linuxhost.NetnsPids(linuxhost.NetnsPath(netns))
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(strings.SplitN(string(cmd), "\x00", 2)[0], "skipper-noderouter") {
			return pid
		}
	}
	t.Fatalf("no skipper-noderouter process in %s", netns)
	return 0
}

// TestBPFFailsOpenWhenRouterStops: with node 2's router hung (SIGSTOP: its
// liveness heartbeat stops, its readiness probe fails), a call to the VIP
// from node 2 still succeeds: BPF stops rewriting after --bpf-max-age and
// kube-proxy carries the call to a ready router elsewhere.
func TestBPFFailsOpenWhenRouterStops(t *testing.T) {
	ctx := t.Context()
	svc, err := env.kube.CoreV1().Services("skipper-system").Get(ctx, "skipper", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := svc.Spec.ClusterIP
	poll.Until(t, time.Minute, pollInterval, "node2's router steers with BPF", func(context.Context) error {
		if v := metricSum(t, routerMetricsURL(2), "skipper_noderouter_bpf_mode", map[string]string{"mode": "connect"}); v != 1 {
			return fmt.Errorf("bpf_mode{mode=connect} = %v", v)
		}
		return nil
	})
	if out, err := callVIPFromNode2(ctx, t, vip, 10*time.Second); err != nil {
		t.Fatalf("call before the stop: %v\n%s", err, out)
	}
	failOpens := metricSum(t, routerMetricsURL(2), "skipper_noderouter_bpf_fail_opens_total", nil)
	echo := map[string]string{"function": "default/echo", "code": "200"}
	served1 := counterSum(t, routerMetricsURL(1), "skipper_noderouter_requests_total", echo)

	pid := routerPid(t, "skipper-node2")
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	start := time.Now()
	// Calls during --bpf-max-age still go to the hung router and time out;
	// then they fail open to the Service, whose node-2 endpoint turns
	// unready once the probe notices.
	var out string
	poll.Until(t, 90*time.Second, pollInterval, "a VIP call from node 2 succeeds with its router stopped", func(ctx context.Context) error {
		out, err = callVIPFromNode2(ctx, t, vip, 3*time.Second)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	t.Logf("node2's router stopped: a VIP call succeeded again after %s", time.Since(start).Round(100*time.Millisecond))
	if !strings.Contains(out, `"function":"default/echo"`) {
		t.Errorf("answer is not the echo function's: %s", out)
	}
	if got := counterSum(t, routerMetricsURL(1), "skipper_noderouter_requests_total", echo) - served1; got < 1 {
		t.Errorf("node1's router served %v calls while node2's was stopped, want ≥ 1", got)
	}
	resume()
	poll.Until(t, time.Minute, pollInterval, "node2's router counts the fail-open", func(context.Context) error {
		v, err := attach.MetricSum(routerMetricsURL(2), "skipper_noderouter_bpf_fail_opens_total", nil)
		if err != nil {
			return err
		}
		if v <= failOpens {
			return fmt.Errorf("bpf_fail_opens_total %v, was %v", v, failOpens)
		}
		return nil
	})
}
