package promql

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var monitoring = filepath.Join("..", "..", "deploy", "monitoring")

func TestMetrics(t *testing.T) {
	for _, tc := range []struct {
		name, q string
		want    []string
		wantErr bool
	}{
		{"rate with variables", `sum by (node) (rate(skipper_noderouter_heartbeat_batches_total{node=~"$node"}[$__rate_interval]))`, []string{"skipper_noderouter_heartbeat_batches_total"}, false},
		{"two metrics, deduplicated", `a_total / a_total + b`, []string{"a_total", "b"}, false},
		{"name matcher", `{__name__="x"}`, []string{"x"}, false},
		{"label_values", `label_values(skipper_noderouter_requests_total, function)`, []string{"skipper_noderouter_requests_total"}, false},
		{"no metric name", `{job="x"}`, nil, true},
		{"does not parse", `sum(rate(x[5m])`, nil, true},
		{"empty", ` `, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Metrics(tc.q)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("names (-want +got):\n%s", diff)
			}
		})
	}
}

// Every query of the shipped dashboard and alerts parses and reads only
// Skipper's own metrics (whether the binaries export them is checked by
// the e2e suite against the running cluster).
func TestShippedQueriesParse(t *testing.T) {
	dash, err := os.ReadFile(filepath.Join(monitoring, "skipper-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(filepath.Join(monitoring, "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	de, err := DashboardExprs(dash)
	if err != nil {
		t.Fatal(err)
	}
	re, err := RuleExprs(rules)
	if err != nil {
		t.Fatal(err)
	}
	if len(de) < 20 || len(re) < 5 {
		t.Fatalf("found %d dashboard and %d rule queries; the extraction lost some", len(de), len(re))
	}
	seen := map[string]bool{}
	for _, e := range slices.Concat(de, re) {
		names, err := Metrics(e.Query)
		if err != nil {
			t.Errorf("%s: %v", e.Where, err)
			continue
		}
		for _, n := range names {
			seen[n] = true
			if !strings.HasPrefix(n, "skipper_controller_") && !strings.HasPrefix(n, "skipper_noderouter_") {
				t.Errorf("%s reads %s, not a Skipper metric", e.Where, n)
			}
		}
	}
	// What operators check first must be on the dashboard (issue 7).
	for _, n := range []string{
		"skipper_noderouter_heartbeat_batches_total", "skipper_noderouter_heartbeat_batch_entries_sum",
		"skipper_noderouter_heartbeat_send_seconds_bucket", "skipper_noderouter_stream_reconnects_total",
		"skipper_noderouter_requests_total", "skipper_noderouter_overhead_seconds_bucket",
		"skipper_noderouter_upstream_seconds_bucket", "skipper_controller_assignment_seconds_bucket",
		"skipper_controller_instances", "skipper_controller_ring_members", "skipper_controller_ownership_moves_total",
		"skipper_noderouter_bpf_mode", "skipper_noderouter_bpf_rewrites_total", "skipper_noderouter_bpf_fail_opens_total",
	} {
		if !seen[n] {
			t.Errorf("no dashboard or alert query reads %s", n)
		}
	}
}
