package e2e

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNodeLocalAddress: every node's router owns 169.254.20.20 (on lo:skipper
// here, where dummy links are unsupported) and serves functions on port 80
// of it, reachable from inside that node.
func TestNodeLocalAddress(t *testing.T) {
	for _, node := range []string{"skipper-node1", "skipper-node2"} {
		t.Run(node, func(t *testing.T) {
			out, err := exec.Command("ip", "-netns", node, "-4", "addr", "show", "dev", "lo").CombinedOutput()
			if err != nil {
				t.Fatalf("ip addr in %s: %v\n%s", node, err, out)
			}
			if !strings.Contains(string(out), "169.254.20.20/32") || !strings.Contains(string(out), "lo:skipper") {
				t.Fatalf("%s has no 169.254.20.20/32 labelled lo:skipper:\n%s", node, out)
			}
			out, err = exec.Command("ip", "netns", "exec", node, "curl", "-sS", "--max-time", "10",
				"-H", "x-skipper-function: default/echo", "http://169.254.20.20/local").CombinedOutput()
			if err != nil {
				t.Fatalf("curl 169.254.20.20 in %s: %v\n%s", node, err, out)
			}
			if !strings.Contains(string(out), `"function":"default/echo"`) {
				t.Fatalf("answer from 169.254.20.20 in %s is not the echo function's: %s", node, out)
			}
		})
	}
}
