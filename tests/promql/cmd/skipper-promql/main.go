// Command skipper-promql checks the PromQL of Skipper's dashboard and alert
// rules and prints the metric names they read, one per line, sorted:
//
//	skipper-promql deploy/monitoring/skipper-dashboard.json deploy/monitoring/alerts.yaml
//
// Files ending in .json are Grafana dashboards, others PrometheusRule YAML.
// It exits 1 naming every query that does not parse. The e2e suite compares
// its output with what the running binaries export. With --queries it prints
// the queries instead, as a JSON array of {"where", "query", "kind"} with
// Grafana variables substituted (kind: panel, variable or rule), for a test
// that runs each against a real Prometheus.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"skipper.dev/skipper/tests/promql"
)

func main() {
	args := os.Args[1:]
	queries := len(args) > 0 && args[0] == "--queries"
	if queries {
		args = args[1:]
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(os.Stderr, "usage: skipper-promql [--queries] <dashboard.json|rules.yaml>...\n\n"+
			"Parses every query with the Prometheus parser and prints the metric names they read;\n"+
			"--queries: print the queries as JSON instead, Grafana variables substituted.")
		os.Exit(2)
	}
	if queries {
		out, err := collect(args)
		if err != nil {
			fmt.Fprintln(os.Stderr, "skipper-promql:", err)
			os.Exit(1)
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return
	}
	names, err := run(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipper-promql:", err)
		os.Exit(1)
	}
	fmt.Println(strings.Join(names, "\n"))
}

// query is one line of --queries output.
type query struct {
	Where string `json:"where"`
	Query string `json:"query"`
	Kind  string `json:"kind"`
}

func collect(files []string) ([]query, error) {
	var out []query
	for _, f := range files {
		exprs, err := read(f)
		if err != nil {
			return nil, err
		}
		for _, e := range exprs {
			if _, err := promql.Metrics(e.Query); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", f, e.Where, err)
			}
			out = append(out, query{Where: e.Where, Query: promql.Substitute(e.Query), Kind: e.Kind})
		}
	}
	return out, nil
}

func read(f string) ([]promql.Expr, error) {
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
	return exprs, nil
}

func run(files []string) ([]string, error) {
	var all []string
	var errs []string
	for _, f := range files {
		exprs, err := read(f)
		if err != nil {
			return nil, err
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
