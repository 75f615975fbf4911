package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// kubectl runs bin/kubectl against the cluster with stdin, bounded by a
// minute, and returns its stdout.
func kubectl(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(env.root, "bin", "kubectl"), append([]string{"--kubeconfig", env.kubeconfig}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.Bytes()
}

// Every kustomize target renders and the real API server accepts it with a
// server-side apply (a dry run: the running cluster was installed from
// overlays/local and examples by make up, which this proves too).
func TestManifestsServerSideApply(t *testing.T) {
	// deploy/monitoring needs the Prometheus Operator's kinds.
	crds := filepath.Join(env.root, "tests", "e2e", "testdata", "monitoring-crds.yaml")
	kubectl(t, nil, "apply", "--server-side", "--field-manager=skipper-e2e", "-f", crds)
	t.Cleanup(func() { kubectl(t, nil, "delete", "--ignore-not-found", "-f", crds) })
	kubectl(t, nil, "wait", "--for=condition=Established", "--timeout=30s",
		"crd/podmonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com")

	for _, tc := range []struct {
		dir       string
		wantKinds []string
	}{
		{"deploy", []string{"Namespace", "CustomResourceDefinition", "Deployment", "DaemonSet", "PodDisruptionBudget", "Service", "ClusterRole"}},
		{"deploy/overlays/local", []string{"Namespace", "Deployment", "DaemonSet"}},
		{"deploy/overlays/tls", []string{"Namespace", "Deployment", "DaemonSet"}},
		{"deploy/overlays/before-1.36", []string{"Namespace", "CustomResourceDefinition", "Deployment", "DaemonSet"}},
		{"deploy/examples", []string{"Deployment", "Function"}},
		{"deploy/examples/protocols", []string{"Deployment", "Function"}},
		{"deploy/overlays/local-examples", []string{"Deployment", "Function"}},
		{"deploy/monitoring", []string{"PodMonitor", "PrometheusRule", "ConfigMap"}},
		{"deploy/sidecar", []string{"ServiceAccount", "RoleBinding", "Deployment"}},
		{"deploy/overlays/local-sidecar", []string{"ServiceAccount", "RoleBinding", "Deployment"}},
	} {
		t.Run(strings.ReplaceAll(tc.dir, "/", "_"), func(t *testing.T) {
			rendered := kubectl(t, nil, "kustomize", filepath.Join(env.root, tc.dir))
			var kinds []string
			for _, line := range strings.Split(string(rendered), "\n") {
				if k, ok := strings.CutPrefix(line, "kind: "); ok {
					kinds = append(kinds, k)
				}
			}
			for _, k := range tc.wantKinds {
				if !slices.Contains(kinds, k) {
					t.Errorf("%s renders kinds %v, missing %s", tc.dir, kinds, k)
				}
			}
			out := kubectl(t, rendered, "apply", "--server-side", "--dry-run=server", "--force-conflicts",
				"--field-manager=skipper-e2e", "-f", "-")
			if n := strings.Count(string(out), "serverside-applied"); n != len(kinds) {
				t.Errorf("%s: %d of %d objects applied:\n%s", tc.dir, n, len(kinds), out)
			}
		})
	}
}
