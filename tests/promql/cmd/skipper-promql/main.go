// Command skipper-promql checks the PromQL of Skipper's dashboard and alert
// rules and prints the metric names they read, one per line, sorted:
//
//	skipper-promql deploy/monitoring/skipper-dashboard.json deploy/monitoring/alerts.yaml
//
// Files ending in .json are Grafana dashboards, others PrometheusRule YAML.
// It exits 1 naming every query that does not parse. The e2e suite compares
// its output with what the running binaries export.
package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"skipper.dev/skipper/tests/promql"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" {
		fmt.Fprintln(os.Stderr, "usage: skipper-promql <dashboard.json|rules.yaml>...\n\nParses every query with the Prometheus parser and prints the metric names they read.")
		os.Exit(2)
	}
	names, err := run(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipper-promql:", err)
		os.Exit(1)
	}
	fmt.Println(strings.Join(names, "\n"))
}

func run(files []string) ([]string, error) {
	var all []string
	var errs []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var exprs []promql.Expr
		if strings.HasSuffix(f, ".json") {
			exprs, err = promql.DashboardExprs(b)
		} else {
			exprs, err = promql.RuleExprs(b)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if len(exprs) == 0 {
			return nil, fmt.Errorf("%s: no queries found", f)
		}
		for _, e := range exprs {
			names, err := promql.Metrics(e.Query)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %s: %v", f, e.Where, err))
				continue
			}
			all = append(all, names...)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%d queries do not parse:\n%s", len(errs), strings.Join(errs, "\n"))
	}
	slices.Sort(all)
	return slices.Compact(all), nil
}
