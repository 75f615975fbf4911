package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"skipper.dev/skipper/tests/attach"
)

// Every metric the dashboard and alert rules read is exported by the
// running binaries (bin/skipper-promql parses each query with the
// Prometheus parser and lists the metrics).
func TestMonitoringQueriesMatchExportedMetrics(t *testing.T) {
	mon := filepath.Join(env.root, "deploy", "monitoring")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(env.root, "bin", "skipper-promql"),
		filepath.Join(mon, "skipper-dashboard.json"), filepath.Join(mon, "alerts.yaml")).Output()
	if err != nil {
		t.Fatalf("skipper-promql: %v", err)
	}
	used := strings.Fields(string(out))
	if len(used) < 20 {
		t.Fatalf("skipper-promql listed %d metrics: %v", len(used), used)
	}
	exported := map[string]bool{}
	for _, url := range append([]string{env.routerMetrics}, env.controllerURLs...) {
		fams, err := attach.Scrape(url)
		if err != nil {
			t.Fatal(err)
		}
		for name, fam := range fams {
			exported[name] = true
			if fam.GetType() == dto.MetricType_HISTOGRAM {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					exported[name+s] = true
				}
			}
		}
	}
	for _, n := range used {
		if !exported[n] {
			t.Errorf("the dashboard or alerts read %s, which no binary exports (or not yet at zero)", n)
		}
	}
}
