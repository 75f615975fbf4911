package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"skipper.dev/skipper/internal/poll"
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
	// Series of owned functions move with ownership (an earlier test may
	// have just killed a controller): poll a little before judging.
	var missing []string
	poll.Until(t, 30*time.Second, pollInterval, "every metric the dashboard and alerts read exported", func(context.Context) error {
		exported := map[string]bool{}
		for _, url := range append([]string{env.routerMetrics}, controllerMetricsURLs(t)...) {
			fams, err := attach.Scrape(url)
			if err != nil {
				return err
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
		missing = missing[:0]
		for _, n := range used {
			if !exported[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("the dashboard or alerts read %v, which no binary exports (or not yet at zero)", missing)
		}
		return nil
	})
}
