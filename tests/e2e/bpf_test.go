package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
		eventually(t, time.Minute, fmt.Sprintf("node%d's router steers with BPF", n), func(context.Context) error {
			if v := metricSum(t, routerMetricsURL(n), "skipper_noderouter_bpf_mode", map[string]string{"mode": "connect"}); v != 1 {
				return fmt.Errorf("bpf_mode{mode=connect} = %v", v)
			}
			return nil
		})
	}
	mnt, err := linuxhost.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	node2Cgroup := filepath.Join(mnt, "skipper", "node2")

	echo := map[string]string{"function": "default/echo", "code": "200"}
	rewrites2 := metricSum(t, routerMetricsURL(2), "skipper_noderouter_bpf_rewrites_total", nil)
	served1 := counterSum(t, routerMetricsURL(1), "skipper_noderouter_requests_total", echo)
	served2 := counterSum(t, routerMetricsURL(2), "skipper_noderouter_requests_total", echo)

	// The caller joins node 2's cgroup, then execs into node 2's network
	// namespace and curl (ip netns exec remounts /sys, so the cgroup comes
	// first): its connect runs the node's programs. The VIP is blackholed
	// outside the cluster's namespaces, so an unsteered call could not
	// succeed.
	const calls = 3
	for range calls {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		out, err := exec.CommandContext(cctx, "sh", "-c",
			`echo $$ > "$1/cgroup.procs" && exec ip netns exec skipper-node2 curl -sS --max-time 10 -H 'x-skipper-function: default/echo' "http://$2/bpf"`,
			"caller", node2Cgroup, vip).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("call %s:80 from node2: %v\n%s", vip, err, out)
		}
		if !strings.Contains(string(out), `"function":"default/echo"`) {
			t.Fatalf("answer via the VIP is not the echo function's: %s", out)
		}
	}
	if got := metricSum(t, routerMetricsURL(2), "skipper_noderouter_bpf_rewrites_total", nil) - rewrites2; got < calls {
		t.Errorf("node2 rewrote %v connects, want ≥ %d", got, calls)
	}
	if got := counterSum(t, routerMetricsURL(2), "skipper_noderouter_requests_total", echo) - served2; got != calls {
		t.Errorf("node2's router served %v calls, want %d", got, calls)
	}
	if got := counterSum(t, routerMetricsURL(1), "skipper_noderouter_requests_total", echo) - served1; got != 0 {
		t.Errorf("node1's router served %v of node2's calls, want 0", got)
	}
}
