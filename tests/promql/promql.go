package promql

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// Expr is one query of the dashboard or the alert rules and where it is.
type Expr struct {
	Where string // "dashboard: <panel title> [A]", "alert: <name>", "variable: node"
	Query string // as written, Grafana variables included
	Kind  string // panel, variable or rule
}

// grafanaVars maps the Grafana variables the dashboard uses to values the
// Prometheus parser accepts (what Grafana would substitute).
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "1m",
	"$__interval", "1m",
	"${node}", ".*", "$node", ".*",
	"${function}", ".*", "$function", ".*",
)

// Substitute replaces the Grafana variables of q with what Grafana would
// put there with every option selected and a 1m rate interval.
func Substitute(q string) string { return grafanaVars.Replace(q) }

// labelValues matches Grafana's label_values(<metric>, <label>) variable
// query, which is not PromQL.
var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// DashboardExprs returns every query of a Grafana dashboard: panel targets
// (also inside collapsed rows) and query variables.
func DashboardExprs(dashboard []byte) ([]Expr, error) {
	type target struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	}
	type panel struct {
		Title   string   `json:"title"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var out []Expr
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				out = append(out, Expr{Where: fmt.Sprintf("dashboard: %s [%s]", p.Title, t.RefID), Query: t.Expr, Kind: "panel"})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			// Older dashboards store the query as a plain string.
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				return nil, fmt.Errorf("variable %s: query: %w", v.Name, err)
			}
		}
		out = append(out, Expr{Where: "variable: " + v.Name, Query: q.Query, Kind: "variable"})
	}
	return out, nil
}

// RuleExprs returns every expression of the PrometheusRule documents in
// rules (a multi-document YAML stream).
func RuleExprs(rules []byte) ([]Expr, error) {
	dec := yaml.NewDecoder(strings.NewReader(string(rules)))
	var out []Expr
	for {
		var doc struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Groups []struct {
					Name  string `yaml:"name"`
					Rules []struct {
						Alert  string `yaml:"alert"`
						Record string `yaml:"record"`
						Expr   string `yaml:"expr"`
					} `yaml:"rules"`
				} `yaml:"groups"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			if err.Error() == "EOF" {
				return out, nil
			}
			return nil, fmt.Errorf("rules: %w", err)
		}
		if doc.Kind != "PrometheusRule" {
			continue
		}
		for _, g := range doc.Spec.Groups {
			for _, r := range g.Rules {
				name := r.Alert
				if name == "" {
					name = "record " + r.Record
				}
				out = append(out, Expr{Where: fmt.Sprintf("rule %s/%s", g.Name, name), Query: r.Expr, Kind: "rule"})
			}
		}
	}
}

// Metrics parses q (after substituting Grafana variables) and returns the
// sorted metric names it selects. A query with a selector without a metric
// name is an error: every query must say what it reads.
func Metrics(q string) ([]string, error) {
	q = strings.TrimSpace(q)
	if q == "" {
		return nil, fmt.Errorf("empty query")
	}
	if m := labelValues.FindStringSubmatch(q); m != nil {
		return []string{m[1]}, nil
	}
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(q))
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", q, err)
	}
	var names []string
	var bad error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
		}
		if name == "" {
			bad = fmt.Errorf("query %q selects series without a metric name", q)
			return nil
		}
		names = append(names, name)
		return nil
	})
	if bad != nil {
		return nil, bad
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}
